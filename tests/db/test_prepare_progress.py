"""member_prepare_progress: a PREPARE step as a job event (state unchanged), once per seq, only while the
member is being prepared, only from the member's own node."""

from __future__ import annotations

import pytest

from tests.launch_fixtures import make_fleet, make_job, make_node, make_user, members_of, report
from tuneplane.app.db import Database
from tuneplane.app.errors import Refusal


def _events(db: Database, job_id: int) -> list[dict]:
    return db.fetch_all(
        "SELECT from_state, to_state, reason, detail FROM job_events"
        " WHERE job_id = %s AND detail ->> 'kind' = 'prepare' ORDER BY id",
        (job_id,),
    )


def test_progress_is_one_event_per_seq_while_preparing(db: Database) -> None:
    fleet = make_fleet(db)
    node = make_node(db, fleet, "a")
    other = make_node(db, fleet, "b")
    job_id = make_job(db, make_user(db), fleet, gpus_per_node=0)
    db.call("reserve_next", fleet, 1000)
    attempt = db.fetch_one("SELECT id FROM attempts WHERE job_id = %s", (job_id,))["id"]
    claim = db.call("claim_launch", attempt, "test-worker")[0]
    db.call("begin_prepare", attempt, claim["epoch"], "0" * 64)
    (member,) = members_of(db, job_id)
    assert member["node_id"] == node
    state = db.fetch_one("SELECT state FROM jobs WHERE id = %s", (job_id,))["state"]

    message = "environment 3f2c: downloading 2 of 5 packages"
    assert report(db, "member_prepare_progress", member, seq="s1", step="downloading", message=message)
    again = report(db, "member_prepare_progress", member, seq="s1", step="downloading", message=message)
    assert again["member_prepare_progress"] == {"duplicate": True}
    (event,) = _events(db, job_id)
    assert event["from_state"] == event["to_state"] == state
    assert event["reason"] == f"rank 0 on a: {message}"
    assert event["detail"]["step"] == "downloading" and event["detail"]["seq"] == "s1"
    assert db.fetch_one("SELECT state FROM jobs WHERE id = %s", (job_id,))["state"] == state

    with pytest.raises(Refusal) as foreign:
        report(db, "member_prepare_progress", {**member, "node_id": other}, seq="s2", step="x")
    assert foreign.value.status == 404
    with pytest.raises(Refusal) as bad:
        report(db, "member_prepare_progress", member, step="x")
    assert bad.value.status == 400

    report(db, "member_prepared", member)  # COMMIT: the member is past PREPARE
    report(db, "member_started", member, pid=1)
    late = report(db, "member_prepare_progress", member, seq="s3", step="late")
    assert late["member_prepare_progress"]["ignored"] is True
    assert len(_events(db, job_id)) == 1
