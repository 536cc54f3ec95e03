"""Placement over a long queue: every queued job is considered (no count cap), a pass writes a waiting job's
reason (and event) only when its situation changes, live attempts never share a rendezvous address and
port, and launch decisions cannot be truncated away."""

from __future__ import annotations

import psycopg
import pytest

from tests.launch_fixtures import job, make_fleet, make_job, make_node, make_user, members_of
from tuneplane.app.db import Database
from tuneplane.app.errors import Refusal

# Test setup only: many queued jobs in one statement (make_job's per-job transactions are slow at 1,200).
MANY_JOBS = """
WITH p AS (
  INSERT INTO previews (owner_id, fleet_id, spec, resolved, canonical, digest, expires_at)
  SELECT %(owner)s, %(fleet)s, '{}', jsonb_build_object('i', i), 'bulk' || i,
         md5('bulk' || i) || md5(i || 'x'), now() + interval '1 hour'
    FROM generate_series(1, %(count)s) i
  RETURNING id
)
INSERT INTO jobs (owner_id, preview_id, fleet_id, state_reason, nodes, gpus_per_node, cpus_per_node,
                  memory_per_node, max_attempts, spec)
SELECT %(owner)s, p.id, %(fleet)s, 'queued', 1, %(gpus)s, 1, 0, 1, '{}' FROM p
"""


def _reserve(db: Database, fleet_id: int) -> list[int]:
    return [row["job_id"] for row in db.call("reserve_next", fleet_id, 1000)]


def test_a_job_that_fits_behind_1200_queued_jobs_that_do_not_is_placed(db: Database) -> None:
    user = make_user(db)
    fleet = make_fleet(db)
    make_node(db, fleet, "small", gpus=4)
    db.fetch_all(MANY_JOBS + " RETURNING id", {"owner": user, "fleet": fleet, "count": 1200, "gpus": 8})
    fits = make_job(db, user, fleet, gpus_per_node=1)
    assert _reserve(db, fleet) == [fits]
    assert job(db, fits)["state"] == "reserved"
    waiting = db.fetch_one(
        "SELECT count(*) AS n, count(DISTINCT state_reason) AS reasons FROM jobs WHERE state = 'queued'"
    )
    assert waiting["n"] == 1200 and waiting["reasons"] == 2  # the head's reason, and "behind job <head>"


def test_a_pass_rewrites_no_reason_and_writes_no_event_while_a_job_waits_for_the_same_thing(
    db: Database,
) -> None:
    user = make_user(db)
    fleet = make_fleet(db)
    make_node(db, fleet, "a", gpus=4)
    make_node(db, fleet, "b", gpus=4)
    head = make_job(db, user, fleet, nodes=3, gpus_per_node=4)  # can never fit: 2 nodes
    behind = [make_job(db, user, fleet, nodes=2, gpus_per_node=4) for _ in range(3)]
    events = "SELECT count(*) AS n FROM job_events WHERE job_id = ANY(%s)"
    _reserve(db, fleet)
    first = db.fetch_one(events, ([head, *behind],))["n"]
    reasons = {j: job(db, j)["state_reason"] for j in [head, *behind]}
    assert "at the head of the queue; only 2 schedulable node(s)" in reasons[head]
    assert all(f"behind job {head} at the head of the queue" in reasons[j] for j in behind)
    # Capacity moves between passes (a small job takes and frees GPUs): the waiting jobs' situation does not.
    for _ in range(3):
        small = make_job(db, user, fleet, gpus_per_node=1, priority=5)
        assert _reserve(db, fleet) == [small]
        db.call("cancel_job", small, user, "making room")
        _reserve(db, fleet)
    assert db.fetch_one(events, ([head, *behind],))["n"] == first
    assert {j: job(db, j)["state_reason"] for j in [head, *behind]} == reasons
    # The figures of the moment are computed when read.
    assert db.fetch_one("SELECT placement_fit_now(%s) AS t", (behind[0],))["t"].startswith(
        "best fit now: 2 nodes can take a member (largest free: 4 GPUs"
    )


def test_live_attempts_never_share_a_rendezvous_address_and_port(db: Database) -> None:
    user = make_user(db)
    fleet = make_fleet(db)
    make_node(db, fleet, "a", gpus=4, address="10.1.0.1")
    db.fetch_all("UPDATE launch_settings SET rendezvous_port_span = 2 RETURNING 1")
    jobs = [make_job(db, user, fleet, gpus_per_node=1) for _ in range(3)]
    assert _reserve(db, fleet) == jobs[:2]
    ports = db.fetch_all("SELECT master_addr, master_port FROM attempts ORDER BY id")
    assert {p["master_addr"] for p in ports} == {"10.1.0.1"}
    assert sorted(p["master_port"] for p in ports) == [29500, 29501]
    assert (
        "waiting for a rendezvous port: every port of 29500..29501 is in use at 10.1.0.1"
        in (job(db, jobs[2])["state_reason"])
    )
    # The table refuses a second live attempt on the same address and port even without placement.
    attempt = members_of(db, jobs[0])[0]["attempt_id"]
    with pytest.raises(psycopg.errors.UniqueViolation), db.transaction() as conn:
        conn.execute(
            "UPDATE attempts SET master_port = (SELECT master_port FROM attempts WHERE id <> %s LIMIT 1)"
            " WHERE id = %s",
            (attempt, attempt),
        )
    # An ended attempt gives its port back.
    db.call("cancel_job", jobs[0], user, "free a port")
    assert _reserve(db, fleet) == [jobs[2]]


def test_launch_decisions_cannot_be_truncated(db: Database) -> None:
    with pytest.raises(Refusal, match="launch_decisions rows are immutable"), db.transaction() as conn:
        conn.execute("TRUNCATE launch_decisions")
