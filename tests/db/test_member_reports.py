"""member_reports and the node gateway's report batching (app/node_gateway/report_batch.py, issue 23): a
gang's burst of member_prepared / member_started reports recorded together, each with its own result or
refusal, against a real database."""

from __future__ import annotations

import asyncio
import json

import pytest

from tests.launch_fixtures import make_fleet, make_job, make_node, make_user, members_of, report
from tuneplane.app.db import Database
from tuneplane.app.errors import Refusal
from tuneplane.app.node_gateway import launch as _launch_reports  # noqa: F401  (registers the kinds)
from tuneplane.app.node_gateway.aiodb import AsyncDatabase
from tuneplane.app.node_gateway.report_batch import batcher
from tuneplane.app.node_gateway.reports import dispatch_report


@pytest.fixture
def gang(db: Database) -> tuple[int, list[dict], list[int]]:
    """A 4-member job on 4 nodes, claimed and sent PREPARE."""
    user = make_user(db)
    fleet = make_fleet(db)
    nodes = [make_node(db, fleet, f"n{i}", gpus=1) for i in range(4)]
    job_id = make_job(db, user, fleet, nodes=4)
    (placed,) = db.call("reserve_next", fleet, 1000)
    epoch = db.call("claim_launch", placed["attempt_id"], "w")[0]["epoch"]
    db.call("begin_prepare", placed["attempt_id"], epoch, "c" * 64)
    return job_id, members_of(db, job_id), nodes


def _batch(db: Database, kind: str, items: list[tuple[int, dict]]) -> list[dict]:
    body = [{"node_id": node, "epoch": 0, "payload": payload} for node, payload in items]
    return db.call("member_reports", kind, json.dumps(body))[0]["member_reports"]


def test_a_batch_is_each_report_on_its_own_and_a_refusal_undoes_only_its_item(db: Database, gang) -> None:
    job_id, members, nodes = gang
    stranger = next(n for n in nodes if n != members[0]["node_id"])
    outcomes = _batch(
        db,
        "member_prepared",
        [(m["node_id"], {"member_id": m["id"]}) for m in members[:3]]
        + [(stranger, {"member_id": members[0]["id"]})],  # not that node's member
    )
    assert [o.get("result") for o in outcomes[:3]] == [
        {"committed": False, "waiting_for": 3},
        {"committed": False, "waiting_for": 2},
        {"committed": False, "waiting_for": 1},
    ]
    assert outcomes[3]["error"]["sqlstate"] == "TP404" and outcomes[3]["error"]["column"] == "member_id"
    assert [m["state"] for m in members_of(db, job_id)] == ["prepared", "prepared", "prepared", "preparing"]
    # The last one, on its own, commits; then all four start in one batch and the attempt is running
    # once, set by the last of them.
    assert report(db, "member_prepared", members[3])["member_prepared"] == {"committed": True}
    outcomes = _batch(
        db, "member_started", [(m["node_id"], {"member_id": m["id"], "pid": 10}) for m in members]
    )
    assert [o["result"]["running"] for o in outcomes] == [1, 2, 3, 4]
    attempt = db.fetch_one("SELECT running_at FROM attempts WHERE job_id = %s", (job_id,))
    started = db.fetch_one("SELECT max(started_at) AS last FROM members WHERE job_id = %s", (job_id,))
    assert attempt["running_at"] is not None and attempt["running_at"] >= started["last"]


def test_a_batch_of_another_kind_or_not_an_array_is_refused(db: Database) -> None:
    with pytest.raises(Refusal) as err:
        db.call("member_reports", "member_exited", "[]")
    assert (err.value.status, err.value.field) == (400, "kind")
    with pytest.raises(Refusal) as err:
        db.call("member_reports", "member_started", "{}")
    assert (err.value.status, err.value.field) == (400, "items")


def test_the_gateway_records_a_burst_of_reports_together_each_answered_as_alone(
    db: Database, db_url: str, gang
) -> None:
    """Through dispatch_report, as the gateway's sessions call it: four concurrent member_prepared, then four
    member_started, plus a refused one in each burst. Each caller gets its own answer; fewer transactions
    than reports were used."""
    job_id, members, nodes = gang
    stranger = next(n for n in nodes if n != members[0]["node_id"])

    async def burst(kind: str, extra: dict) -> list:
        adb = AsyncDatabase(db_url, max_size=4)
        await adb.open()
        try:
            calls = [
                dispatch_report(adb, m["node_id"], 0, kind, {"member_id": m["id"], **extra}) for m in members
            ]
            calls.append(dispatch_report(adb, stranger, 0, kind, {"member_id": members[0]["id"], **extra}))
            outcomes = await asyncio.gather(*calls, return_exceptions=True)
            return [outcomes, dict(batcher(adb).stats)]
        finally:
            await adb.close()

    prepared, stats = asyncio.run(burst("member_prepared", {}))
    assert isinstance(prepared[4], Refusal) and prepared[4].status == 404
    assert sorted(json.dumps(p, sort_keys=True) for p in prepared[:4]) == sorted(
        [json.dumps({"committed": True})]
        + [json.dumps({"committed": False, "waiting_for": n}) for n in (1, 2, 3)]
    )
    assert stats["batches"] >= 1 and stats["reports"] == 5
    started, stats = asyncio.run(burst("member_started", {"pid": 7}))
    assert isinstance(started[4], Refusal) and started[4].status == 404
    assert sorted(s["running"] for s in started[:4]) == [1, 2, 3, 4]
    assert [m["state"] for m in members_of(db, job_id)] == ["running"] * 4
    assert db.fetch_one("SELECT running_at FROM attempts WHERE job_id = %s", (job_id,))["running_at"]


def test_a_batch_that_fails_unexpectedly_answers_every_sender_at_once(db_url: str, monkeypatch) -> None:
    """A batch whose outcome cannot be read (a bug, not a database error) must not leave its senders waiting
    for their 30 s timeout: each gets the error, and the next burst is recorded again."""

    async def run() -> tuple[list, list]:
        adb = AsyncDatabase(db_url, max_size=2)
        await adb.open()
        try:
            calls = {"n": 0}

            async def broken(function, *args):
                calls["n"] += 1
                if function == "member_reports":
                    return [{"member_reports": []}]  # fewer outcomes than items: zip(strict=True) raises
                raise Refusal("no such member", status=404)

            monkeypatch.setattr(adb, "call_retrying", broken)
            first = await asyncio.wait_for(
                asyncio.gather(
                    *(batcher(adb).submit("member_started", 1, 0, {"member_id": i}) for i in range(4)),
                    return_exceptions=True,
                ),
                timeout=5,
            )
            again = await asyncio.wait_for(
                asyncio.gather(
                    batcher(adb).submit("member_started", 1, 0, {"member_id": 9}), return_exceptions=True
                ),
                timeout=5,
            )
            return first, again
        finally:
            await adb.close()

    first, again = asyncio.run(run())
    assert [type(outcome) for outcome in first] == [ValueError] * 4, first  # one batch, each sender answered
    assert isinstance(again[0], Refusal)  # the next report is recorded (alone) as usual
