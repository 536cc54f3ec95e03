"""A fenced node's job is retried elsewhere only once its KILL is acknowledged or the node is known gone
(issue 24): what the fence of a connected node holds, what releases it, and a failed KILL that a later
successful one clears.
"""

from __future__ import annotations

import json

import pytest

from tests.launch_fixtures import job, make_fleet, make_job, make_node, make_user, members_of, run_to_running
from tuneplane.app.db import Database
from tuneplane.app.errors import Refusal


@pytest.fixture
def scene(db: Database) -> dict:
    """A connected node `n0` (session 1, reconciled) running job 1 (one member, two attempts allowed), and an
    idle node `n1` where the retry can go."""
    user = make_user(db)
    fleet = make_fleet(db)
    node = make_node(db, fleet, "n0", gpus=1)
    job_id = make_job(db, user, fleet, max_attempts=2)
    db.call("reserve_next", fleet, 1000)
    (member,) = run_to_running(db, job_id)
    make_node(db, fleet, "n1", gpus=1)
    epoch = db.call("node_session_opened", node, "127.0.0.1", "test")[0]["epoch"]
    running = {"running": [{"member_id": member["id"], "pid": 1}], "exited": []}
    db.call("reconcile_node", node, epoch, json.dumps(running))
    return {"fleet": fleet, "node": node, "job": job_id, "member": member, "epoch": epoch}


def _kills(db: Database, node: int) -> list[dict]:
    return db.fetch_all(
        "SELECT * FROM node_commands WHERE node_id = %s AND kind = 'kill' ORDER BY id", (node,)
    )


def _attempts(db: Database, job_id: int) -> int:
    return db.fetch_one("SELECT count(*) AS n FROM attempts WHERE job_id = %s", (job_id,))["n"]


def test_a_connected_fenced_node_holds_its_member_until_the_kill_is_acknowledged(
    db: Database, scene: dict
) -> None:
    db.call("fence_node", "gpu/n0", "psu", "test")
    (lost,) = members_of(db, scene["job"])
    assert lost["state"] == "lost" and lost["released_at"] is None
    assert "stays held until node n0 acknowledges its KILL" in job(db, scene["job"])["state_reason"]
    db.call("reserve_next", scene["fleet"], 1000)
    assert _attempts(db, scene["job"]) == 1  # not retried while it may still run on n0
    (kill,) = _kills(db, scene["node"])
    db.call("ack_node_command", scene["node"], scene["epoch"], kill["id"], json.dumps({"killed": 1}), None)
    assert members_of(db, scene["job"])[0]["released_at"] is not None
    assert job(db, scene["job"])["state"] == "queued"
    db.call("reserve_next", scene["fleet"], 1000)
    second = [m for m in members_of(db, scene["job"]) if m["attempt"] == 2]
    assert [m["node_id"] for m in second] != [scene["node"]] and len(second) == 1


def test_a_fenced_node_that_goes_lost_is_known_gone_and_the_sweep_releases_its_member(
    db: Database, scene: dict
) -> None:
    db.call("fence_node", "gpu/n0", "psu", "test")
    assert db.call("sweep_lost_nodes")[0]["sweep_lost_nodes"] == 0  # still connected: nothing
    assert members_of(db, scene["job"])[0]["released_at"] is None
    db.fetch_all(
        "UPDATE nodes SET last_heartbeat_at = now() - interval '1 hour' WHERE id = %s RETURNING 1",
        (scene["node"],),
    )
    assert db.call("sweep_lost_nodes")[0]["sweep_lost_nodes"] == 1
    assert members_of(db, scene["job"])[0]["released_at"] is not None
    assert job(db, scene["job"])["state"] == "queued"


def test_fencing_a_node_already_lost_or_retiring_it_releases_at_once(db: Database, scene: dict) -> None:
    db.fetch_all(
        "UPDATE nodes SET last_heartbeat_at = now() - interval '1 hour' WHERE id = %s RETURNING 1",
        (scene["node"],),
    )
    db.call("fence_node", "gpu/n0", "dead", "test")
    assert members_of(db, scene["job"])[0]["released_at"] is not None
    assert job(db, scene["job"])["state"] == "queued"


def test_retiring_a_connected_node_releases_at_once_and_still_sends_kill(db: Database, scene: dict) -> None:
    db.call("retire_node", "gpu/n0", "gone", "test")
    (lost,) = members_of(db, scene["job"])
    assert lost["state"] == "lost" and lost["released_at"] is not None
    assert [k["payload"]["member_ids"] for k in _kills(db, scene["node"])] == [[scene["member"]["id"]]]
    # The agent still holds its session: the KILL is delivered and its acknowledgement recorded.
    claimed = db.call("claim_node_commands", scene["node"], scene["epoch"], 100)
    (delivered,) = [c for c in claimed if c["kind"] == "kill"]
    acked = db.call("ack_node_command", scene["node"], scene["epoch"], delivered["id"], "{}", None)[0]
    assert acked["acked_at"] is not None


def test_a_later_successful_kill_clears_an_earlier_failed_one(db: Database, scene: dict) -> None:
    db.call("fence_node", "gpu/n0", "psu", "test")
    (kill,) = _kills(db, scene["node"])
    db.call("ack_node_command", scene["node"], scene["epoch"], kill["id"], None, "2 process(es) still alive")
    assert members_of(db, scene["job"])[0]["released_at"] is None  # a failed KILL proves nothing
    with pytest.raises(Refusal, match="failed since the fence"):
        db.call("unfence_node", "gpu/n0", "repaired", "test")
    # The agent reconnects and still runs the member: reconcile sends KILL again; this one succeeds.
    epoch = db.call("node_session_opened", scene["node"], "127.0.0.1", "test")[0]["epoch"]
    running = {"running": [{"member_id": scene["member"]["id"], "pid": 1}], "exited": []}
    assert db.call("reconcile_node", scene["node"], epoch, json.dumps(running))[0]["reconcile_node"][
        "kill"
    ] == [scene["member"]["id"]]
    again = _kills(db, scene["node"])[-1]
    assert again["id"] != kill["id"]
    db.call("ack_node_command", scene["node"], epoch, again["id"], json.dumps({"killed": 1}), None)
    assert members_of(db, scene["job"])[0]["released_at"] is not None
    assert db.call("unfence_node", "gpu/n0", "repaired", "test")[0]["unfence_node"] is True
