"""reconcile_node and a member that ended while its node was away: the node reports it under `exited`
with its exit status (the agent's durable end record), and the database records that status. Such a
member is never failed as gone ("exit status unknown") and never KILLed; a later member_exited report
of the same end changes nothing."""

from __future__ import annotations

import json

import pytest

from tests.launch_fixtures import (
    job,
    make_fleet,
    make_job,
    make_node,
    make_user,
    members_of,
    run_to_running,
)
from tuneplane.app.db import Database


def _running_member_of_a_node_that_went_away(db: Database) -> tuple[int, dict, int]:
    fleet = make_fleet(db)
    node = make_node(db, fleet, "n0", gpus=2)
    job_id = make_job(db, make_user(db), fleet, gpus_per_node=2)
    db.call("reserve_next", fleet, 1000)
    (member,) = run_to_running(db, job_id)
    db.fetch_all(
        "UPDATE nodes SET last_heartbeat_at = now() - interval '1 hour' WHERE id = %s RETURNING 1", (node,)
    )
    db.call("sweep_lost_nodes")
    epoch = db.call("node_session_opened", node, "127.0.0.1", "test")[0]["epoch"]
    return job_id, member, epoch


@pytest.mark.parametrize(
    ("exit_code", "member_state", "job_state", "reason"),
    [(0, "exited", "succeeded", "exited with status 0"), (3, "failed", "failed", "exited with status 3")],
)
def test_an_exit_status_reported_in_a_reconcile_is_recorded_never_gone(
    db: Database, exit_code: int, member_state: str, job_state: str, reason: str
) -> None:
    job_id, member, epoch = _running_member_of_a_node_that_went_away(db)
    body = {
        "running": [],
        "exited": [
            {"member_id": member["id"], "exit_code": exit_code, "reason": f"exited with status {exit_code}"}
        ],
    }
    result = db.call("reconcile_node", member["node_id"], epoch, json.dumps(body))[0]["reconcile_node"]
    assert (result["gone"], result["kill"]) == (0, [])
    (after,) = members_of(db, job_id)
    assert (after["state"], after["exit_code"], after["reason"]) == (member_state, exit_code, reason)
    assert after["released_at"] is not None and after["contact_lost_at"] is None
    assert job(db, job_id)["state"] == job_state
    assert "exit status unknown" not in job(db, job_id)["state_reason"]
    # The agent's own member_exited report of the same end arrives afterwards: nothing changes.
    again = {"member_id": member["id"], "exit_code": exit_code, "reason": "again"}
    db.call("member_exited", member["node_id"], epoch, json.dumps(again))
    assert members_of(db, job_id)[0]["reason"] == reason
