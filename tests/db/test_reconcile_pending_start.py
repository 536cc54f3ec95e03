"""reconcile_node: a member whose node lost contact after COMMIT but before it handled START stays
`starting`, not recorded as gone (its pending START would otherwise start it on released resources); a
START the node acknowledges with an error fails the member (decided in SQL, ack_node_command)."""

from __future__ import annotations

import json

from tests.launch_fixtures import job, make_fleet, make_job, make_node, make_user, members_of, report
from tuneplane.app.db import Database


def test_a_member_whose_start_is_still_pending_is_not_taken_for_gone(db: Database) -> None:
    fleet = make_fleet(db)
    node = make_node(db, fleet, "n0", gpus=2)
    job_id = make_job(db, make_user(db), fleet, gpus_per_node=2)
    (placed,) = db.call("reserve_next", fleet, 1000)
    epoch = db.call("claim_launch", placed["attempt_id"], "w")[0]["epoch"]
    db.call("begin_prepare", placed["attempt_id"], epoch, "a" * 64)
    (member,) = members_of(db, job_id)
    report(db, "member_prepared", member)  # COMMIT; START is in the node's outbox, not yet handled
    # Test setup: the node stopped heartbeating an hour ago.
    db.fetch_all(
        "UPDATE nodes SET last_heartbeat_at = now() - interval '1 hour' WHERE id = %s RETURNING 1", (node,)
    )
    assert db.call("sweep_lost_nodes")[0]["sweep_lost_nodes"] == 1
    (member,) = members_of(db, job_id)
    assert member["state"] == "starting" and member["contact_lost_at"] is not None

    result = db.call("reconcile_node", node, 0, json.dumps({"running": [], "exited": []}))[0][
        "reconcile_node"
    ]
    assert (result["starting"], result["gone"]) == (1, 0)
    (member,) = members_of(db, job_id)
    assert member["state"] == "starting" and member["released_at"] is None
    assert member["contact_lost_at"] is None

    (start,) = db.fetch_all("SELECT id FROM node_commands WHERE kind = 'start'")
    db.call("ack_node_command", node, 0, start["id"], None, "could not start: runtime pin refused")
    (member,) = members_of(db, job_id)
    assert member["state"] == "failed" and member["released_at"] is not None
    assert "could not be started: could not start: runtime pin refused" in member["reason"]
    assert job(db, job_id)["state"] == "failed"
