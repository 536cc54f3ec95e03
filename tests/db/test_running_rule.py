""" "Running" means every member started, on every backend: attempts.running_at (and the job's event "all N
member(s) running") is set by the LAST member's start (member_now_running, launch.sql). The Slurm path's
end-to-end proof is tests/e2e/test_slurm.py::test_a_member_that_starts_2s_after_the_other_…"""

from __future__ import annotations

import pytest

from tests.launch_fixtures import make_fleet, make_job, make_node, make_user, members_of, report
from tuneplane.app.db import Database


@pytest.fixture
def committed(db: Database) -> tuple[int, dict, list[dict]]:
    """A 2-member job on two nodes, COMMIT recorded (both members `starting`)."""
    user = make_user(db)
    fleet = make_fleet(db)
    for i in range(2):
        make_node(db, fleet, f"n{i}", gpus=1)
    job_id = make_job(db, user, fleet, nodes=2, gpus_per_node=1)
    db.call("reserve_next", fleet, 1000)
    attempt = db.fetch_one("SELECT * FROM attempts WHERE job_id = %s", (job_id,))
    epoch = db.call("claim_launch", attempt["id"], "w1")[0]["epoch"]
    db.call("begin_prepare", attempt["id"], epoch, "a" * 64)
    members = members_of(db, job_id)
    for m in members:
        report(db, "member_prepared", m)
    assert [m["state"] for m in members_of(db, job_id)] == ["starting", "starting"]
    return job_id, attempt, members


def _attempt(db: Database, attempt_id: int) -> dict:
    return db.fetch_one("SELECT * FROM attempts WHERE id = %s", (attempt_id,))


def _all_running_events(db: Database, job_id: int) -> list[str]:
    rows = db.fetch_all("SELECT reason FROM job_events WHERE job_id = %s ORDER BY id", (job_id,))
    return [r["reason"] for r in rows if "member(s) running" in r["reason"]]


def test_node_attempt_is_running_only_once_its_second_member_started(db: Database, committed) -> None:
    job_id, attempt, (m0, m1) = committed
    assert report(db, "member_started", m0, pid=100)["member_started"] == {"running": 1, "of": 2}
    assert _attempt(db, attempt["id"])["running_at"] is None  # one of two: not running yet
    assert _all_running_events(db, job_id) == []
    report(db, "member_started", m1, pid=101)
    running_at = _attempt(db, attempt["id"])["running_at"]
    started = {m["rank"]: m["started_at"] for m in members_of(db, job_id)}
    assert running_at is not None and running_at >= max(started.values())
    assert _all_running_events(db, job_id) == ["attempt 1: all 2 member(s) running"]
    report(db, "member_started", m1, pid=101)  # a repeated report changes nothing
    assert _attempt(db, attempt["id"])["running_at"] == running_at
    assert len(_all_running_events(db, job_id)) == 1


def test_a_member_that_already_ended_counts_as_started(db: Database, committed) -> None:
    """The first member ran and exited 0 before the second started: the attempt still ran (all started)."""
    _job_id, attempt, (m0, m1) = committed
    report(db, "member_started", m0, pid=100)
    report(db, "member_exited", m0, exit_code=0, reason="exited with status 0")
    assert _attempt(db, attempt["id"])["running_at"] is None
    report(db, "member_started", m1, pid=101)
    assert _attempt(db, attempt["id"])["running_at"] is not None
