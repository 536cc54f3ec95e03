"""Confirmation: preview + digest + retry key → exactly one job and a receipt; retries are idempotent."""

from __future__ import annotations

import threading

import pytest

from tests.helpers import wait_for
from tests.submission_setup import add_user, one_local_fleet
from tuneplane.app.db import Database
from tuneplane.app.errors import Refusal
from tuneplane.app.submission import service

DEMO = {"recipe": {"name": "demo", "params": {"steps": 5}}}


def job_count(db: Database) -> int:
    return db.fetch_one("SELECT count(*) AS n FROM jobs")["n"]


@pytest.fixture
def alice(db: Database) -> int:
    user = add_user(db, "alice")
    one_local_fleet(db)
    return user


def test_confirmation_returns_a_receipt_and_a_queued_job_with_its_reason(db: Database, alice: int) -> None:
    preview = service.create_preview(db, alice, DEMO)
    assert job_count(db) == 0, "a preview creates no job"
    receipt = service.confirm(db, alice, preview["id"], preview["digest"], "k1")
    assert receipt["preview_id"] == preview["id"] and receipt["digest"] == preview["digest"]
    assert receipt["state"] == "queued" and not receipt["replayed"] and receipt["created_at"]
    job = db.call("get_job", alice, receipt["job_id"])[0]
    assert job["state"] == "queued" and job["state_reason"].startswith("waiting for resources")
    assert job["owner"] == "alice" and job["fleet"] == "local" and job["retry_key"] == "k1"
    events = db.call("job_events_of", alice, receipt["job_id"])
    assert [(e["from_state"], e["to_state"]) for e in events] == [(None, "queued")]
    assert events[0]["reason"] == job["state_reason"]


def test_same_triple_again_returns_the_same_receipt(db: Database, alice: int) -> None:
    preview = service.create_preview(db, alice, DEMO)
    first = service.confirm(db, alice, preview["id"], preview["digest"], "k1")
    again = service.confirm(db, alice, preview["id"], preview["digest"], "k1")
    assert again["job_id"] == first["job_id"] and again["replayed"] and job_count(db) == 1


def test_twenty_concurrent_identical_confirmations_make_exactly_one_job(db: Database, alice: int) -> None:
    preview = service.create_preview(db, alice, DEMO)
    racers = Database(db.url, min_size=20, max_size=20, name="racers")
    barrier = threading.Barrier(20)
    receipts: list[dict] = []
    errors: list[BaseException] = []
    lock = threading.Lock()

    def confirm() -> None:
        barrier.wait()
        try:
            receipt = service.confirm(racers, alice, preview["id"], preview["digest"], "same-key")
            with lock:
                receipts.append(receipt)
        except BaseException as exc:  # collected and asserted below
            with lock:
                errors.append(exc)

    try:
        threads = [threading.Thread(target=confirm) for _ in range(20)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
    finally:
        racers.close()
    assert not errors, errors
    assert len(receipts) == 20
    assert len({r["job_id"] for r in receipts}) == 1
    assert sum(1 for r in receipts if not r["replayed"]) == 1
    assert job_count(db) == 1
    assert db.fetch_one("SELECT count(*) AS n FROM confirmations")["n"] == 1


def test_same_retry_key_with_other_preview_is_refused(db: Database, alice: int) -> None:
    first = service.create_preview(db, alice, DEMO)
    other = service.create_preview(db, alice, {"recipe": {"name": "demo", "params": {"steps": 7}}})
    service.confirm(db, alice, first["id"], first["digest"], "k1")
    with pytest.raises(Refusal) as err:
        service.confirm(db, alice, other["id"], other["digest"], "k1")
    assert err.value.status == 409 and err.value.field == "retry_key"
    assert "already used to confirm preview" in err.value.message and "new retry key" in err.value.message
    assert job_count(db) == 1


def test_same_retry_key_with_an_identical_new_preview_returns_the_first_receipt(
    db: Database, alice: int
) -> None:
    first = service.create_preview(db, alice, DEMO)
    second = service.create_preview(db, alice, DEMO)  # `tuneplane submit` run twice: same content
    a = service.confirm(db, alice, first["id"], first["digest"], "k1")
    b = service.confirm(db, alice, second["id"], second["digest"], "k1")
    assert b["job_id"] == a["job_id"] and b["replayed"] and b["preview_id"] == first["id"]
    assert job_count(db) == 1


def test_wrong_digest_is_refused(db: Database, alice: int) -> None:
    preview = service.create_preview(db, alice, DEMO)
    with pytest.raises(Refusal) as err:
        service.confirm(db, alice, preview["id"], "0" * 64, "k1")
    assert err.value.status == 409 and err.value.field == "digest"
    with pytest.raises(Refusal) as malformed:
        service.confirm(db, alice, preview["id"], "abc", "k1")
    assert malformed.value.status == 400 and malformed.value.field == "digest"
    assert job_count(db) == 0


def test_expired_preview_is_refused_but_an_earlier_confirmation_still_replays(
    db: Database, alice: int
) -> None:
    admin = add_user(db, "root", "admin")
    db.call("set_submission_setting", admin, "preview_ttl_seconds", 0)
    preview = service.create_preview(db, alice, DEMO)
    with pytest.raises(Refusal) as err:
        service.confirm(db, alice, preview["id"], preview["digest"], "k1")
    assert err.value.status == 410 and "expired" in err.value.message
    assert job_count(db) == 0
    # A confirmation made in time still replays after the preview expired.
    db.call("set_submission_setting", admin, "preview_ttl_seconds", 1)
    fresh = service.create_preview(db, alice, {"recipe": {"name": "demo", "params": {"steps": 9}}})
    receipt = service.confirm(db, alice, fresh["id"], fresh["digest"], "k2")
    wait_for(
        lambda: db.fetch_one("SELECT expires_at < now() AS past FROM previews WHERE id = %s", (fresh["id"],))[
            "past"
        ],
        timeout=5,
        what="the preview to expire",
    )
    replay = service.confirm(db, alice, fresh["id"], fresh["digest"], "k2")
    assert replay["job_id"] == receipt["job_id"] and replay["replayed"]


def test_another_retry_key_for_an_already_confirmed_preview_is_refused(db: Database, alice: int) -> None:
    preview = service.create_preview(db, alice, DEMO)
    receipt = service.confirm(db, alice, preview["id"], preview["digest"], "k1")
    with pytest.raises(Refusal) as err:
        service.confirm(db, alice, preview["id"], preview["digest"], "k2")
    assert err.value.status == 409 and f"job {receipt['job_id']}" in err.value.message
    assert job_count(db) == 1
    assert db.fetch_one("SELECT count(*) AS n FROM confirmations")["n"] == 1


def test_default_retry_key_makes_plain_confirm_idempotent(db: Database, alice: int) -> None:
    preview = service.create_preview(db, alice, DEMO)
    a = service.confirm(db, alice, preview["id"], preview["digest"], None)
    b = service.confirm(db, alice, preview["id"], preview["digest"], "")
    assert a["job_id"] == b["job_id"] and a["retry_key"] == f"preview-{preview['id']}"


def test_another_users_preview_cannot_be_confirmed(db: Database, alice: int) -> None:
    bob = add_user(db, "bob")
    admin = add_user(db, "root", "admin")
    preview = service.create_preview(db, alice, DEMO)
    for actor in (bob, admin):
        with pytest.raises(Refusal) as err:
            service.confirm(db, actor, preview["id"], preview["digest"], "k1")
        assert err.value.status == 404
    assert job_count(db) == 0


def test_users_see_their_own_jobs_and_admins_see_all(db: Database, alice: int) -> None:
    bob = add_user(db, "bob")
    admin = add_user(db, "root", "admin")
    pa = service.create_preview(db, alice, DEMO)
    pb = service.create_preview(db, bob, DEMO)
    ja = service.confirm(db, alice, pa["id"], pa["digest"], "a")["job_id"]
    jb = service.confirm(db, bob, pb["id"], pb["digest"], "b")["job_id"]
    assert [j["id"] for j in db.call("list_jobs", alice, None, 100, None)] == [ja]
    assert [j["id"] for j in db.call("list_jobs", bob, None, 100, None)] == [jb]
    assert [j["id"] for j in db.call("list_jobs", admin, None, 100, None)] == [jb, ja]
    with pytest.raises(Refusal) as err:
        db.call("get_job", bob, ja)
    assert err.value.status == 404
    with pytest.raises(Refusal):
        db.call("job_events_of", bob, ja)
    assert db.call("get_job", admin, ja)[0]["owner"] == "alice"
    with pytest.raises(Refusal) as bad_state:
        db.call("list_jobs", alice, "sleeping", 100, None)
    assert bad_state.value.field == "state"


def test_every_transition_writes_an_event_and_terminal_states_are_final(db: Database, alice: int) -> None:
    preview = service.create_preview(db, alice, DEMO)
    job_id = service.confirm(db, alice, preview["id"], preview["digest"], "k")["job_id"]
    db.call("explain_job", job_id, "queued", "waiting: no node has a free GPU")
    db.call("explain_job", job_id, "queued", "waiting: no node has a free GPU")  # unchanged: no event
    db.call("job_transition", job_id, "queued", "cancelled", "cancelled by alice", '{"by": "alice"}')
    events = db.call("job_events_of", alice, job_id)
    assert [e["to_state"] for e in events] == ["queued", "queued", "cancelled"]
    assert events[-1]["detail"] == {"by": "alice"} and events[-1]["from_state"] == "queued"
    with pytest.raises(Refusal) as err:
        db.call("job_transition", job_id, "cancelled", "queued", "again")
    assert err.value.status == 409
    with pytest.raises(Refusal) as direct:
        db.fetch_all("UPDATE jobs SET state = 'running', state_reason = 'x' WHERE id = %s", (job_id,))
    assert direct.value.status == 409 and "cannot become running" in direct.value.message
