"""Team webhooks (sql/functions/team_events.sql, workers/backend/webhook_delivery.py): events queued by the
transaction that changed a job's state, sent signed by a loop outside it, tried again with a back-off."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from datetime import timedelta

import pytest

from tests.launch_fixtures import make_fleet, make_job, make_node, make_user, report, run_to_running
from tests.webhook_receiver import Receiver
from tuneplane.app.db import Database
from tuneplane.app.errors import Refusal
from tuneplane.app.node_gateway.aiodb import AsyncDatabase
from tuneplane.app.webhook_signature import SIGNATURE_HEADER, sign, verify
from tuneplane.workers.backend.webhook_delivery import WebhookDeliverer

SECRET = "s3cret-s3cret-s3cret"


@pytest.fixture(autouse=True)
def loopback_allowed(monkeypatch: pytest.MonkeyPatch) -> None:
    """The receiver listens on loopback, which the webhook target policy refuses unless the operator
    opens it (app/webhook_targets.py): these tests run with the allow-list set to 127.0.0.1."""
    monkeypatch.setenv("TUNEPLANE_WEBHOOK_ALLOW", "127.0.0.1")


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    yield r
    r.close()


def _deliver_all(db_url: str, rounds: int = 1) -> None:
    """Runs the real delivery loop's pass `rounds` times (due rows only)."""

    async def go() -> None:
        adb = AsyncDatabase(db_url, min_size=1, max_size=2, name="test-webhooks")
        await adb.open()
        try:
            deliverer = WebhookDeliverer(adb, "test", say=lambda _line: None)
            for _ in range(rounds):
                await deliverer.deliver_due()
        finally:
            await adb.close()

    asyncio.run(go())


def _setup(db: Database) -> tuple[int, int, int]:
    fleet = make_fleet(db)
    make_node(db, fleet, "n0", gpus=4)
    return fleet, make_user(db, "alice"), make_user(db, "bob")


def test_a_state_change_is_queued_in_its_transaction_for_the_team_only(
    db: Database, db_url: str, receiver: Receiver
) -> None:
    fleet, alice, bob = _setup(db)
    hook = db.call("create_team_webhook", alice, "alice", receiver.url, SECRET, None)[0]
    mine, theirs = make_job(db, alice, fleet), make_job(db, bob, fleet)
    db.call("reserve_next", fleet, 10)
    for job_id in (mine, theirs):
        members = run_to_running(db, job_id)
        report(db, "member_exited", members[0], exit_code=0)
    queued = db.fetch_all("SELECT job_id, kind, webhook_id FROM team_event_deliveries ORDER BY id")
    assert [(q["job_id"], q["kind"]) for q in queued] == [
        (mine, "job.reserved"), (mine, "job.preparing"), (mine, "job.running"), (mine, "job.succeeded")
    ]  # fmt: skip
    assert {q["webhook_id"] for q in queued} == {hook["id"]}
    _deliver_all(db_url)
    # Sent concurrently: the order of arrival is not promised (each body says when it happened).
    assert sorted(g["body"]["kind"] for g in receiver.got) == sorted(q["kind"] for q in queued)
    for g in receiver.got:
        assert verify(SECRET, g["headers"][SIGNATURE_HEADER], g["raw"])
        assert g["body"]["job"]["id"] == mine and g["body"]["team"] == "alice"
        assert g["headers"]["X-TunePlane-Event-Id"] == g["body"]["id"]
    assert db.fetch_one("SELECT count(*) AS n FROM team_event_deliveries WHERE state = 'delivered'")["n"] == 4


def test_a_failed_try_is_sent_again_after_its_back_off_with_the_same_event_id(
    db: Database, db_url: str
) -> None:
    fleet, alice, _bob = _setup(db)
    receiver = Receiver([500])
    try:
        db.call("create_team_webhook", alice, "alice", receiver.url, SECRET, ["job.cancelled"])
        job_id = make_job(db, alice, fleet)
        db.call("cancel_job", job_id, alice, None)
        _deliver_all(db_url)
        row = db.fetch_one("SELECT * FROM team_event_deliveries")
        assert row["state"] == "pending" and row["attempts"] == 1 and row["last_status"] == 500
        assert row["next_attempt_at"] > row["created_at"]
        _deliver_all(db_url)  # not due yet: nothing sent
        assert len(receiver.got) == 1
        db.fetch_all("UPDATE team_event_deliveries SET next_attempt_at = now() RETURNING id")
        _deliver_all(db_url)
        assert [g["body"]["id"] for g in receiver.got] == [str(row["event_id"])] * 2
        tries = db.call("team_event_deliveries_of", alice, "alice", 10)[0]
        assert tries["state"] == "delivered"
        assert [(t["attempt"], t["status"]) for t in tries["tries"]] == [(1, 500), (2, 200)]
    finally:
        receiver.close()


def test_back_off_doubles_and_a_delivery_is_given_up_after_max_attempts(db: Database) -> None:
    fleet, alice, _bob = _setup(db)
    db.fetch_all("UPDATE webhook_settings SET max_attempts = 3, backoff_base = '10 seconds' RETURNING 1")
    db.call("create_team_webhook", alice, "alice", "https://example.invalid/hook", SECRET, None)
    db.call("cancel_job", make_job(db, alice, fleet), alice, None)
    waits = []
    for attempt in (1, 2, 3):
        db.fetch_all("UPDATE team_event_deliveries SET next_attempt_at = now() - interval '1 ms' RETURNING 1")
        claimed = db.call("claim_team_event_deliveries", "w", 10)
        assert [c["attempt"] for c in claimed] == [attempt]
        state = db.call("team_event_delivery_result", claimed[0]["delivery_id"], attempt, None, "refused", 5)
        row = db.fetch_one("SELECT * FROM team_event_deliveries")
        waits.append(row["next_attempt_at"] - db.fetch_one("SELECT clock_timestamp() AS t")["t"])
        assert state[0]["team_event_delivery_result"] == ("gave_up" if attempt == 3 else "pending")
    assert timedelta(seconds=9) < waits[0] <= timedelta(seconds=10)
    assert timedelta(seconds=19) < waits[1] <= timedelta(seconds=20)
    assert db.call("claim_team_event_deliveries", "w", 10) == []


def test_a_late_result_of_a_taken_over_try_is_logged_not_obeyed(db: Database) -> None:
    fleet, alice, _bob = _setup(db)
    db.call("create_team_webhook", alice, "alice", "https://example.invalid/hook", SECRET, None)
    db.call("cancel_job", make_job(db, alice, fleet), alice, None)
    first = db.call("claim_team_event_deliveries", "w1", 10)[0]
    # w1 hangs past its claim; w2 takes the delivery over.
    db.fetch_all("UPDATE team_event_deliveries SET claimed_until = now() - interval '1 ms' RETURNING 1")
    second = db.call("claim_team_event_deliveries", "w2", 10)[0]
    assert second["attempt"] == 2 and second["event_id"] == first["event_id"]
    assert db.call("team_event_delivery_result", first["delivery_id"], 1, 200, None, 9000)[0][
        "team_event_delivery_result"
    ] == "pending"  # fmt: skip
    assert db.call("team_event_delivery_result", second["delivery_id"], 2, 204, None, 10)[0][
        "team_event_delivery_result"
    ] == "delivered"  # fmt: skip
    # A repeated report of the same try changes nothing.
    db.call("team_event_delivery_result", second["delivery_id"], 2, 500, None, 10)
    row = db.fetch_one("SELECT state, last_status FROM team_event_deliveries")
    assert (row["state"], row["last_status"]) == ("delivered", 204)


@pytest.mark.parametrize(
    ("url", "secret", "kinds", "field"),
    [
        ("http://example.com/hook", SECRET, None, "url"),
        ("ftp://127.0.0.1/hook", SECRET, None, "url"),
        ("https://example.com/hook", "short", None, "secret"),
        ("https://example.com/hook", SECRET, ["Succeeded"], "kinds"),
        ("https://example.com/hook", SECRET, [], "kinds"),
    ],
)
def test_bad_webhooks_are_refused_naming_the_field(db: Database, url: str, secret: str, kinds: list | None,
                                                   field: str) -> None:  # fmt: skip
    alice = make_user(db, "alice")
    with pytest.raises(Refusal) as refused:
        db.call("create_team_webhook", alice, "alice", url, secret, kinds)
    assert refused.value.status == 400 and field in refused.value.fields
    assert db.fetch_one("SELECT count(*) AS n FROM team_webhooks")["n"] == 0


def test_only_team_admins_manage_webhooks_and_see_deliveries(db: Database) -> None:
    _fleet, alice, bob = _setup(db)
    carol = make_user(db, "carol")
    team = db.fetch_one("SELECT id FROM teams WHERE name = 'alice'")["id"]
    db.fetch_all("INSERT INTO team_members (team_id, user_id, role) VALUES (%s, %s, 'member') RETURNING 1",
                 (team, carol))  # fmt: skip
    hook = db.call("create_team_webhook", alice, "alice", "https://example.com/h", SECRET, None)[0]
    for actor, status in ((bob, 404), (carol, 403)):
        for call in (
            ("create_team_webhook", actor, "alice", "https://example.com/x", SECRET, None),
            ("remove_team_webhook", actor, "alice", hook["id"]),
            ("team_event_deliveries_of", actor, "alice", 10),
            ("team_webhooks_of", actor, "alice"),
        ):
            with pytest.raises(Refusal) as refused:
                db.call(*call)
            assert refused.value.status == status, call
    listed = db.call("team_webhooks_of", alice, "alice")
    assert [w["url"] for w in listed] == ["https://example.com/h"] and "secret" not in listed[0]
    assert db.call("remove_team_webhook", alice, "alice", hook["id"])[0]["remove_team_webhook"] is True
    assert db.call("team_webhooks_of", alice, "alice") == []


def test_enqueue_team_event_is_the_way_in_for_other_lifecycles(db: Database, db_url: str,
                                                             receiver: Receiver) -> None:  # fmt: skip
    fleet, alice, _bob = _setup(db)
    db.call("create_team_webhook", alice, "alice", receiver.url, SECRET, ["job.idle_warning"])
    job_id = make_job(db, alice, fleet)
    queued = db.call("enqueue_team_event", job_id, "job.idle_warning", json.dumps({"idle_gpus": 2}))
    assert queued[0]["enqueue_team_event"] == 1
    assert db.call("enqueue_team_event", job_id, "job.preempted", None)[0]["enqueue_team_event"] == 0
    _deliver_all(db_url)
    assert [g["body"]["data"] for g in receiver.got] == [{"idle_gpus": 2}]
    with pytest.raises(Refusal):
        db.call("enqueue_team_event", job_id, "Idle Warning", None)


def test_signature_verifies_only_the_same_body_secret_and_a_recent_time() -> None:
    header = sign(SECRET, b'{"a":1}', timestamp=1_000_000)
    assert verify(SECRET, header, b'{"a":1}', now=1_000_010)
    assert not verify(SECRET, header, b'{"a":2}', now=1_000_010)
    assert not verify("another-secret-123", header, b'{"a":1}', now=1_000_010)
    assert not verify(SECRET, header, b'{"a":1}', now=1_000_000 + 301)
    assert not verify(SECRET, "garbage", b'{"a":1}')
