"""Each long-lived process that LISTENs listens again after a failover, runs its one poll then, and a NOTIFY
sent after it wakes the process (issue 33 acceptance). The processes: the node gateway
(`tuneplane_node_commands`), the node worker's placement loop (`tuneplane_placement`, `tuneplane_job_queued`,
`tuneplane_team_events`) and its pgqueuer consumer (pgqueuer's own channel); the Slurm worker in
test_pg_failover_slurm.py. The server, the telemetry gateway and the sweeps LISTEN to nothing: their pools
reconnect (test_pg_failover_jobs.py).

Every poll is set to 120 s here. The standby is promoted DOWN_S after the kill, when the LISTEN loops'
back-off is at 5 s: a job confirmed at once on the new primary sends its NOTIFY to nobody, and only the poll
each process runs when it listens again moves it. A job confirmed after that can only be placed (the
worker woken by `tuneplane_job_queued`), its PREPARE and START delivered (the gateway woken by
`tuneplane_node_commands`) and its queued `launch` job taken (pgqueuer woken by its NOTIFY) within the
bound below if the NOTIFYs reach the new LISTEN connections. The agent keeps its control session
throughout (the gateway did not lose it), so no session start wakes delivery either.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.e2e.launch_cluster import MIB, TINY_MEMBER, Cluster
from tests.helpers import wait_for
from tests.node_helpers import fast_thresholds
from tests.pg_failover import available, failover_cluster
from tuneplane.app.db import Database

pytestmark = [pytest.mark.e2e, pytest.mark.skipif(available() is not None, reason=str(available()))]

POLL_S = "120"  # every fallback poll: far beyond the bound below
WOKEN_S = 45.0  # a launch woken by NOTIFYs takes seconds; only a missed NOTIFY waits for a 120 s poll
LISTENERS = ("tuneplane-node-gateway-listen", "tuneplane-worker-listen")
# The outage: the LISTEN back-off (0.25 s doubling to 5 s) tries at 0.25 … 7.75, 12.75 s after the kill, so
# a promotion at 8 s leaves ~4.7 s before anything listens again.
DOWN_S = 8.0


def _listening(db: Database) -> set[str]:
    try:
        rows = db.fetch_all(
            "SELECT application_name FROM pg_stat_activity"
            " WHERE query LIKE 'LISTEN%%' AND NOT pg_is_in_recovery()"
        )
    except Exception:  # the pool meets the failover: nothing listens yet as far as we can tell
        return set()
    return {r["application_name"] for r in rows}


def _count(db: Database, rows: str) -> int:
    return int(db.fetch_one(f"SELECT count(*) AS n FROM {rows}")["n"])


def test_every_listener_is_woken_by_a_notify_after_the_failover(tmp_path: Path, port: int) -> None:
    with failover_cluster() as pg:
        db = Database(pg.url, name="tuneplane-test")
        cluster = Cluster(pg.url, db, tmp_path, port)
        fresh: Database | None = None
        try:
            cluster.start(gateway_args=("--poll-interval", POLL_S))
            # Heartbeats are not what this test is about: a node silent through the outage must still be
            # schedulable when the worker's poll after re-LISTENing places the job (else that pass finds no
            # node and the next one is the 120 s poll; with the default 1 s poll nobody would notice).
            fast_thresholds(db, stale=30.0, lost=60.0)
            agent = cluster.start_agent("a")
            cluster.start_worker("--poll-interval", POLL_S)
            archive = cluster.upload_source({"job.py": TINY_MEMBER})
            flag = tmp_path / "go"
            flag.write_text("go")
            spec = {
                "source": {"archive": archive, "entrypoint": "python job.py", "integration": "script"},
                "resources": {
                    "nodes": 1,
                    "gpus_per_node": 0,
                    "cpus_per_node": 1,
                    "memory_per_node": 64 * MIB,
                },
                "env": {"RELEASE_FLAG": str(flag)},
            }
            wait_for(lambda: set(LISTENERS) <= _listening(db), timeout=60, what="LISTEN before the failover")
            sessions = sum("connected to" in line for line in agent.out.lines)

            pg.fail_over(DOWN_S)
            # A new pool reaches the new primary at once (the old one is still backing off): a job confirmed
            # before anything listens again, its NOTIFY heard by nobody.
            cluster.db = fresh = Database(pg.url, name="tuneplane-test-after")
            missed = cluster.submit(spec)
            confirmed = time.time()
            wait_for(
                lambda: set(LISTENERS) <= _listening(fresh), timeout=60, what="LISTEN on the new primary"
            )
            started = fresh.fetch_all(
                "SELECT application_name, extract(epoch FROM backend_start) AS t FROM pg_stat_activity"
                " WHERE application_name = ANY(%s)",
                (list(LISTENERS),),
            )
            assert all(float(r["t"]) > confirmed for r in started), "listening again before the confirmation"
            # The poll each ran when it listened again placed it and delivered its commands.
            cluster.wait_members(missed, "running", timeout=WOKEN_S)
            wait_for(
                lambda: (
                    _count(fresh, "pg_stat_activity WHERE application_name = 'tuneplane-worker-queue'") == 1
                ),
                timeout=60,
                what="the queue consumer on the new primary",
            )

            job_id = cluster.submit(spec)
            cluster.wait_members(job_id, "running", timeout=WOKEN_S)
            # Its `launch` queue job (enqueued with the reservation) was taken by the consumer, not left for
            # the 120 s dequeue timeout.
            wait_for(
                lambda: _count(fresh, "pgqueuer WHERE entrypoint = 'launch'") == 0,
                timeout=WOKEN_S,
                what="the launch queue job taken",
            )
            for done in (missed, job_id):
                job = cluster.wait_job(done, ("succeeded", "failed", "cancelled"), timeout=WOKEN_S)
                assert job["state"] == "succeeded", cluster.diagnose(done)
            assert sum("connected to" in line for line in agent.out.lines) == sessions, agent.out.text()
        finally:
            cluster.stop_all()
            db.close()
            if fresh is not None:
                fresh.close()
