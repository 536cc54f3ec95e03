"""The node backend worker against a real database (in process) and the SQL it relies on (0043): launch
with a real capsule, abort when the capsule cannot be built, fencing of a stale worker, re-enqueueing a
lost launch job, NOTIFY waking placement, the capsule read check and member telemetry tokens."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import pytest

from tests.e2e.launch_cluster import source_archive
from tests.launch_fixtures import job, make_fleet, make_job, make_node, make_user, members_of, report
from tests.unit.test_capsule_and_runner import SCRIPT, _spec, _store_archive
from tuneplane.app.blobstore import FilesystemBlobStore
from tuneplane.app.db import Database
from tuneplane.app.errors import Refusal
from tuneplane.app.security import new_token
from tuneplane.app.submission import service
from tuneplane.workers.backend.node_worker import NodeWorker, WorkerOptions
from tuneplane.workers.capsule import unpack_capsule


@pytest.fixture
def setup(db: Database, tmp_path: Path) -> dict:
    user = make_user(db)
    fleet = make_fleet(db)
    nodes = [make_node(db, fleet, f"n{i}", gpus=2) for i in range(2)]
    for i, node in enumerate(nodes):
        db.call("report_node_probe", node, 0, json.dumps({"port": 40000 + i}))
    blobs = FilesystemBlobStore(tmp_path / "blobs")
    sha = _store_archive(blobs, source_archive({"main.py": SCRIPT}))
    return {"user": user, "fleet": fleet, "nodes": nodes, "blobs": blobs, "spec": _spec(sha), "tmp": tmp_path}


def _worker(db_url: str, setup: dict, **kw) -> NodeWorker:
    return NodeWorker(WorkerOptions(db_url, setup["tmp"] / "blobs", "w-test", **kw), say=lambda _l: None)


def _job_with_spec(db: Database, setup: dict, spec: dict, **kw) -> int:
    job_id = make_job(db, setup["user"], setup["fleet"], **kw)
    db.fetch_all("UPDATE jobs SET spec = %s WHERE id = %s RETURNING 1", (json.dumps(spec), job_id))
    return job_id


async def _launch(worker: NodeWorker, attempt_id: int) -> str:
    await worker.db.open()
    try:
        return await worker.launch_attempt(attempt_id)
    finally:
        await worker.db.close()


def test_worker_builds_the_capsule_and_sends_prepare_with_peers_probe_ports(
    db: Database, db_url: str, setup: dict
) -> None:
    job_id = _job_with_spec(db, setup, setup["spec"], nodes=2)
    (placed,) = db.call("reserve_next", setup["fleet"], 1000)
    assert asyncio.run(_launch(_worker(db_url, setup), placed["attempt_id"])) == "preparing"
    attempt = db.fetch_one("SELECT * FROM attempts WHERE id = %s", (placed["attempt_id"],))
    digest = attempt["capsule_digest"]
    assert setup["blobs"].exists(digest)
    unpack_capsule(setup["blobs"].path(digest), digest, setup["tmp"] / "unpacked")  # verifies
    prepares = db.fetch_all("SELECT * FROM node_commands WHERE kind = 'prepare' ORDER BY id")
    assert len(prepares) == 2
    peers = prepares[0]["payload"]["peers"]
    assert [p["probe_port"] for p in peers] == [40000, 40001]
    assert prepares[0]["payload"]["capsule_digest"] == digest
    assert job(db, job_id)["state"] == "preparing"
    # pgqueuer re-running the job: nothing more happens.
    assert asyncio.run(_launch(_worker(db_url, setup), placed["attempt_id"])) == "already preparing"
    assert len(db.fetch_all("SELECT 1 FROM node_commands WHERE kind = 'prepare'")) == 2


def test_a_capsule_that_cannot_be_built_aborts_the_attempt_with_the_reason(
    db: Database, db_url: str, setup: dict
) -> None:
    spec = json.loads(json.dumps(setup["spec"]))
    spec["input"]["archive"]["sha256"] = "f" * 64  # not in the blob store
    job_id = _job_with_spec(db, setup, spec)
    (placed,) = db.call("reserve_next", setup["fleet"], 1000)
    outcome = asyncio.run(_launch(_worker(db_url, setup), placed["attempt_id"]))
    assert outcome.startswith("aborted")
    row = job(db, job_id)
    assert row["state"] == "failed" and "capsule could not be built" in row["state_reason"]
    assert "not in the blob store" in row["state_reason"]
    assert db.fetch_one("SELECT count(*) AS n FROM members WHERE released_at IS NULL")["n"] == 0


def test_a_stale_worker_can_neither_abort_nor_begin_prepare(db: Database, setup: dict) -> None:
    make_job(db, setup["user"], setup["fleet"])
    (placed,) = db.call("reserve_next", setup["fleet"], 1000)
    old = db.call("claim_launch", placed["attempt_id"], "w1")[0]["epoch"]
    db.call("claim_launch", placed["attempt_id"], "w2")
    with pytest.raises(Refusal) as err:
        db.call("abort_launch", placed["attempt_id"], old, "late")
    assert err.value.status == 409
    assert (
        db.fetch_one("SELECT state FROM attempts WHERE id = %s", (placed["attempt_id"],))["state"]
        == "reserved"
    )


def test_a_lost_launch_job_is_enqueued_again_once(db: Database, setup: dict) -> None:
    make_job(db, setup["user"], setup["fleet"])
    (placed,) = db.call("reserve_next", setup["fleet"], 1000)
    assert (
        db.call("requeue_stalled_launches", "0 seconds")[0]["requeue_stalled_launches"] == 0
    )  # still queued
    db.fetch_all(
        "DELETE FROM pgqueuer WHERE entrypoint = 'launch' RETURNING 1"
    )  # a handler failed terminally
    assert db.call("requeue_stalled_launches", "1 hour")[0]["requeue_stalled_launches"] == 0  # too young
    assert db.call("requeue_stalled_launches", "0 seconds")[0]["requeue_stalled_launches"] == 1
    assert db.call("requeue_stalled_launches", "0 seconds")[0]["requeue_stalled_launches"] == 0
    (queued,) = db.fetch_all("SELECT payload FROM pgqueuer WHERE entrypoint = 'launch'")
    assert json.loads(bytes(queued["payload"])) == {"attempt_id": placed["attempt_id"]}


def test_a_node_may_read_only_the_capsule_of_its_own_held_members(db: Database, setup: dict) -> None:
    job_id = make_job(db, setup["user"], setup["fleet"])
    (placed,) = db.call("reserve_next", setup["fleet"], 1000)
    epoch = db.call("claim_launch", placed["attempt_id"], "w")[0]["epoch"]
    db.call("begin_prepare", placed["attempt_id"], epoch, "c" * 64)
    (member,) = members_of(db, job_id)
    other = next(n for n in setup["nodes"] if n != member["node_id"])

    def may(node: int, digest: str) -> bool:
        return db.call("node_may_read_capsule", node, digest)[0]["node_may_read_capsule"]

    assert (
        may(member["node_id"], "c" * 64) and not may(other, "c" * 64) and not may(member["node_id"], "d" * 64)
    )
    db.call("cancel_job", job_id, setup["user"], None)
    assert not may(member["node_id"], "c" * 64)  # released: no longer


def test_a_member_telemetry_token_is_scoped_to_it_and_only_its_hash_is_stored(
    db: Database, setup: dict
) -> None:
    job_id = make_job(db, setup["user"], setup["fleet"])
    (placed,) = db.call("reserve_next", setup["fleet"], 1000)
    (member,) = members_of(db, job_id)
    plaintext, digest = new_token("tpt")
    with pytest.raises(Refusal) as err:  # not started yet
        report(db, "issue_member_telemetry_token", member, token_hash=digest)
    assert err.value.status == 409
    epoch = db.call("claim_launch", placed["attempt_id"], "w")[0]["epoch"]
    db.call("begin_prepare", placed["attempt_id"], epoch, "c" * 64)
    report(db, "member_prepared", member)
    issued = report(db, "issue_member_telemetry_token", member, token_hash=digest)[
        "issue_member_telemetry_token"
    ]
    assert (issued["job_id"], issued["attempt"], issued["member_rank"]) == (job_id, 1, 0)
    scope = db.call("authenticate_telemetry_token", digest)[0]
    assert (scope["job_id"], scope["attempt"], scope["member_rank"]) == (job_id, 1, 0)
    stored = db.fetch_all("SELECT * FROM telemetry_tokens")
    assert plaintext not in json.dumps(stored, default=str)
    other = next(n for n in setup["nodes"] if n != member["node_id"])
    with pytest.raises(Refusal) as err:
        db.call(
            "issue_member_telemetry_token",
            other,
            0,
            json.dumps({"member_id": member["id"], "token_hash": new_token("tpt")[1]}),
        )
    assert err.value.status == 404


def _confirm(db: Database, user_id: int) -> int:
    preview = service.create_preview(db, user_id, {"recipe": {"name": "demo"}, "fleet": "gpu"})
    return service.confirm(db, user_id, preview["id"], preview["digest"], "k1")["job_id"]


def test_a_confirmation_wakes_the_placement_loop_without_waiting_for_the_poll(
    db: Database, db_url: str, setup: dict
) -> None:
    """The poll is 30 s here: a job reserved within a few seconds was woken by NOTIFY."""

    async def scenario() -> float:
        worker = _worker(db_url, setup, poll_interval=30.0)
        await worker.db.open()
        tasks = [asyncio.create_task(worker._listen()), asyncio.create_task(worker._schedule())]
        try:
            await asyncio.sleep(1.0)  # the first pass (on start) is over, LISTEN is up
            started = time.monotonic()
            job_id = await asyncio.to_thread(_confirm, db, setup["user"])
            while job(db, job_id)["state"] == "queued":
                assert time.monotonic() - started < 5, "placement was not woken"
                await asyncio.sleep(0.05)
            return time.monotonic() - started
        finally:
            worker.stop.set()
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await worker.db.close()

    assert asyncio.run(scenario()) < 5


def _count_capsule_writes(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts real capsule writes (and makes each take a while, so two launches overlap)."""
    from tuneplane.workers.backend import capsule_build

    writes: list[int] = []
    real = capsule_build.write_capsule

    def slow_counted(spec, entries, out):
        writes.append(1)
        time.sleep(0.3)
        return real(spec, entries, out)

    monkeypatch.setattr(capsule_build, "write_capsule", slow_counted)
    return writes


def test_the_direct_launch_and_the_queued_launch_of_one_attempt_build_its_capsule_once(
    db: Database, db_url: str, setup: dict, monkeypatch: pytest.MonkeyPatch
) -> None:
    writes = _count_capsule_writes(monkeypatch)
    _job_with_spec(db, setup, setup["spec"])
    (placed,) = db.call("reserve_next", setup["fleet"], 1000)
    worker = _worker(db_url, setup)

    async def both() -> list[str]:
        await worker.db.open()
        try:
            # What placement_pass's direct launch and pgqueuer's `launch` job do for the same attempt.
            return await asyncio.gather(
                worker.launch_attempt(placed["attempt_id"]), worker.launch_attempt(placed["attempt_id"])
            )
        finally:
            await worker.db.close()

    assert asyncio.run(both()) == ["preparing", "preparing"]
    assert len(writes) == 1
    assert (
        db.fetch_one("SELECT launch_epoch FROM attempts WHERE id = %s", (placed["attempt_id"],))[
            "launch_epoch"
        ]
        == 1
    )  # claimed once
    assert len(db.fetch_all("SELECT 1 FROM node_commands WHERE kind = 'prepare'")) == 1


def test_two_workers_launching_one_attempt_write_its_capsule_once(
    db: Database, db_url: str, setup: dict, monkeypatch: pytest.MonkeyPatch
) -> None:
    writes = _count_capsule_writes(monkeypatch)
    _job_with_spec(db, setup, setup["spec"])
    (placed,) = db.call("reserve_next", setup["fleet"], 1000)
    first, second = _worker(db_url, setup), _worker(db_url, setup)

    async def both() -> list[str]:
        return await asyncio.gather(
            _launch(first, placed["attempt_id"]), _launch(second, placed["attempt_id"])
        )

    outcomes = sorted(asyncio.run(both()))
    assert len(writes) == 1
    # The later claim fenced the earlier one off; the capsule was written once and used by the winner.
    assert outcomes in (["preparing", "taken over"], ["already preparing", "preparing"]), outcomes
    attempt = db.fetch_one(
        "SELECT state, capsule_digest FROM attempts WHERE id = %s", (placed["attempt_id"],)
    )
    assert attempt["state"] == "preparing" and setup["blobs"].exists(attempt["capsule_digest"])


def _prepare_both(db: Database, setup: dict) -> tuple[int, list[dict], list[tuple[str, str]]]:
    job_id = make_job(db, setup["user"], setup["fleet"], nodes=2)
    (placed,) = db.call("reserve_next", setup["fleet"], 1000)
    epoch = db.call("claim_launch", placed["attempt_id"], "w")[0]["epoch"]
    db.call("begin_prepare", placed["attempt_id"], epoch, "c" * 64)
    return job_id, members_of(db, job_id), [new_token("tpt") for _ in range(2)]


def _token_scope(db: Database, digest: str) -> dict | None:
    try:
        (scope,) = db.call("authenticate_telemetry_token", digest)
    except Refusal as refusal:
        assert refusal.status == 401, refusal
        return None
    return scope


def _start_payloads(db: Database, job_id: int) -> dict[int, dict]:
    rows = db.fetch_all(
        "SELECT c.payload FROM node_commands c JOIN members m ON m.id = (c.payload ->> 'member_id')::bigint"
        " WHERE c.kind = 'start' AND m.job_id = %s",
        (job_id,),
    )
    return {int(r["payload"]["member_id"]): r["payload"] for r in rows}


def test_the_telemetry_token_made_at_prepare_is_issued_at_commit_and_start_says_so(
    db: Database, setup: dict
) -> None:
    """Issue 23: the hash sent with member_prepared is not a token until COMMIT; COMMIT issues one per
    member, scoped to it, and START carries `telemetry_token: true` (the agent then asks for none)."""
    job_id, members, tokens = _prepare_both(db, setup)
    report(db, "member_prepared", members[0], telemetry_token_hash=tokens[0][1])
    assert _token_scope(db, tokens[0][1]) is None  # not yet: no COMMIT
    assert db.fetch_all("SELECT * FROM telemetry_members WHERE job_id = %s", (job_id,)) == []
    assert report(db, "member_prepared", members[1], telemetry_token_hash=tokens[1][1])[
        "member_prepared"
    ] == {"committed": True}
    for member, (_plaintext, digest) in zip(members, tokens, strict=True):
        scope = _token_scope(db, digest)
        assert scope is not None
        assert (scope["job_id"], scope["attempt"], scope["member_rank"]) == (job_id, 1, member["rank"])
    assert {p["telemetry_token"] for p in _start_payloads(db, job_id).values()} == {True}
    stored = json.dumps(db.fetch_all("SELECT * FROM telemetry_tokens"), default=str)
    assert tokens[0][0] not in stored and tokens[1][0] not in stored
    # The agent's own report for the same hash (an agent that did not see the flag) is the same token.
    started = report(db, "issue_member_telemetry_token", members[0], token_hash=tokens[0][1])
    assert started["issue_member_telemetry_token"]["member_rank"] == members[0]["rank"]


def test_a_launch_that_aborts_before_commit_issues_no_telemetry_token(db: Database, setup: dict) -> None:
    job_id, members, tokens = _prepare_both(db, setup)
    report(db, "member_prepared", members[0], telemetry_token_hash=tokens[0][1])
    report(db, "member_prepare_failed", members[1], reason="disk full")
    assert _token_scope(db, tokens[0][1]) is None
    assert db.fetch_all("SELECT * FROM telemetry_tokens WHERE job_id = %s", (job_id,)) == []
    assert db.fetch_all("SELECT * FROM telemetry_members WHERE job_id = %s", (job_id,)) == []
    assert _start_payloads(db, job_id) == {}


def test_a_member_prepared_without_a_hash_gets_a_start_without_the_flag(db: Database, setup: dict) -> None:
    job_id, members, tokens = _prepare_both(db, setup)
    report(db, "member_prepared", members[0], telemetry_token_hash=tokens[0][1])
    report(db, "member_prepared", members[1])  # an older agent, or a node without a telemetry URL
    payloads = _start_payloads(db, job_id)
    assert payloads[members[0]["id"]].get("telemetry_token") is True
    assert "telemetry_token" not in payloads[members[1]["id"]]
    assert db.fetch_one("SELECT count(*) AS n FROM telemetry_tokens WHERE job_id = %s", (job_id,))["n"] == 1


@pytest.mark.parametrize("bad", ["A" * 64, "abc", 12, None, "g" * 64])
def test_a_malformed_token_hash_is_refused_naming_the_field_and_changes_nothing(
    db: Database, setup: dict, bad: object
) -> None:
    job_id, members, _tokens = _prepare_both(db, setup)
    before = members_of(db, job_id)
    with pytest.raises(Refusal) as err:
        report(db, "member_prepared", members[0], telemetry_token_hash=bad)
    assert (err.value.status, err.value.field) == (400, "telemetry_token_hash")
    assert members_of(db, job_id) == before
