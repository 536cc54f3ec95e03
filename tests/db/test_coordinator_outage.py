"""The coordinator's outage never counts against a node's heartbeat (issue 33, migration 0250).

While the database is away (a restart, a failover) the node gateway cannot write any heartbeat, however
alive the nodes are. sweep_lost_nodes notices the gap in its own runs and counts silence from the
coordinator's return instead: nobody is marked lost for the outage; a node still silent lost_after after
the return is.
"""

from __future__ import annotations

from tests.launch_fixtures import make_fleet, make_job, make_node, make_user, members_of, run_to_running
from tuneplane.app.db import Database


def _launch_running(db: Database) -> tuple[int, dict]:
    user = make_user(db)
    fleet_id = make_fleet(db)
    make_node(db, fleet_id, "n0", gpus=4)
    job_id = make_job(db, user, fleet_id)
    db.call("reserve_next", fleet_id, 1000)
    (member,) = run_to_running(db, job_id)
    return job_id, member


def _sweep(db: Database) -> int:
    return db.call("sweep_lost_nodes")[0]["sweep_lost_nodes"]


def _outage(db: Database, seconds: int) -> None:
    """The database was away for `seconds`: no sweep ran and no heartbeat was written meanwhile."""
    db.fetch_all(
        "UPDATE coordinator_clock SET swept_at = swept_at - make_interval(secs => %s) RETURNING 1", (seconds,)
    )
    db.fetch_all(
        "UPDATE nodes SET last_heartbeat_at = now() - make_interval(secs => %s) RETURNING 1", (seconds,)
    )


def test_an_outage_longer_than_lost_after_marks_no_node_lost(db: Database) -> None:
    job_id, member = _launch_running(db)
    assert _sweep(db) == 0  # the first sweep: the clock starts
    _outage(db, 600)  # far beyond lost_after (90 s)
    assert _sweep(db) == 0
    assert [m["contact_lost_at"] for m in members_of(db, job_id)] == [None]
    back_at = db.fetch_one("SELECT back_at FROM coordinator_clock")["back_at"]
    assert back_at is not None
    # A node still silent lost_after after the coordinator came back is lost all the same.
    db.fetch_all("UPDATE coordinator_clock SET back_at = now() - interval '91 seconds' RETURNING 1")
    assert _sweep(db) == 1
    assert [m["contact_lost_at"] is not None for m in members_of(db, job_id)] == [True]
    assert member["id"] == members_of(db, job_id)[0]["id"]


def test_without_an_outage_a_silent_node_is_lost_as_before(db: Database) -> None:
    job_id, _member = _launch_running(db)
    assert _sweep(db) == 0
    db.fetch_all("UPDATE nodes SET last_heartbeat_at = now() - interval '1 hour' RETURNING 1")
    assert _sweep(db) == 1  # sweeps ran all along: the silence is the node's
    assert [m["contact_lost_at"] is not None for m in members_of(db, job_id)] == [True]
