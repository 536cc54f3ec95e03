"""record_commit (sql/functions/launch.sql): the one COMMIT decision, taken the same way for a node fleet
(member_prepared) and a Slurm fleet (slurm_member_prepared). Only the last prepared member commits; the
decision, the attempt, the members and the job read the same on both backends; START commands go only to
nodes whose agents read an outbox."""

from __future__ import annotations

import json

from tests.launch_fixtures import job, make_job, make_user, members_of, report
from tests.submission_setup import add_fleet, add_node
from tuneplane.app.db import Database


def _decision(db: Database, attempt_id: int) -> dict | None:
    return db.fetch_one("SELECT decision, reason FROM launch_decisions WHERE attempt_id = %s", (attempt_id,))


def _starts(db: Database, attempt_id: int) -> int:
    return db.fetch_one(
        "SELECT count(*) AS n FROM node_commands"
        " WHERE kind = 'start' AND (payload ->> 'attempt_id')::bigint = %s",
        (attempt_id,),
    )["n"]


def test_a_slurm_attempt_commits_on_its_last_prepared_member_like_a_node_attempt(db: Database) -> None:
    status = {
        "version": "22.05.8",
        "partition": {"max_nodes": 2, "max_time_minutes": 60},
        "nodes": [
            {"name": f"s{i}", "address": f"10.0.0.{i}", "state": "idle", "reason": None, "cpus": 2,
             "memory_mb": 1000, "gpus": 2, "gpu_model": "gpu"}
            for i in (1, 2)
        ],
    }  # fmt: skip
    fleet = db.call("create_slurm_fleet", "hpc", "gpu", None, '{"shared_path": "/shared"}', "acct", None)[0][
        "id"
    ]
    db.call("slurm_sync_fleet", fleet, json.dumps(status))
    job_id = make_job(db, make_user(db, "vera"), fleet, nodes=2, gpus_per_node=1)
    attempt = db.call("slurm_submissions_due", fleet)[0]["attempt_id"]
    db.call("slurm_submitted", attempt, 4242)
    db.call("slurm_allocation_started", attempt, ["s1", "s2"], 29500, "0" * 64)

    assert db.call("slurm_member_prepared", attempt, 0)[0]["slurm_member_prepared"] is None
    assert _decision(db, attempt) is None and job(db, job_id)["state"] == "preparing"
    assert db.call("slurm_member_prepared", attempt, 1)[0]["slurm_member_prepared"] == "commit"
    assert _decision(db, attempt) == {"decision": "commit", "reason": "all 2 member(s) prepared"}
    assert [m["state"] for m in members_of(db, job_id)] == ["starting", "starting"]
    row = db.fetch_one("SELECT state, committed_at FROM attempts WHERE id = %s", (attempt,))
    assert row["state"] == "running" and row["committed_at"] is not None
    assert job(db, job_id)["state"] == "running"
    assert "attempt 1: commit recorded; starting 2 member(s)" in job(db, job_id)["state_reason"]
    assert _starts(db, attempt) == 0  # the batch script starts the workload step, not an agent
    # A repeated report changes nothing.
    assert db.call("slurm_member_prepared", attempt, 1)[0]["slurm_member_prepared"] == "commit"


def test_a_node_attempt_commits_once_and_sends_one_start_per_member(db: Database) -> None:
    fleet = add_fleet(db, "gpu")
    for name in ("n1", "n2"):
        add_node(db, fleet, name, gpus=1)
    job_id = make_job(db, make_user(db, "alice"), fleet, nodes=2, gpus_per_node=1)
    db.call("reserve_next", fleet, 1000)
    attempt = members_of(db, job_id)[0]["attempt_id"]
    lease = db.call("claim_launch", attempt, "test")[0]
    db.call("begin_prepare", attempt, lease["epoch"], "0" * 64)
    first, second = members_of(db, job_id)
    assert report(db, "member_prepared", first)["member_prepared"]["committed"] is False
    assert report(db, "member_prepared", second)["member_prepared"]["committed"] is True
    assert _decision(db, attempt) == {"decision": "commit", "reason": "all 2 member(s) prepared"}
    assert _starts(db, attempt) == 2
    assert report(db, "member_prepared", second)["member_prepared"]["ignored"] is True
    assert _starts(db, attempt) == 2
