"""Each long-lived process that LISTENs listens again after a failover, and a NOTIFY sent after it wakes the
process (issue 33 acceptance). The processes: the node gateway (`tuneplane_node_commands`), the node worker's
placement loop (`tuneplane_placement`, `tuneplane_job_queued`, `tuneplane_team_events`) and its pgqueuer
consumer (pgqueuer's own channel). The Slurm worker's loop is the same code (reconnect.listen_forever_sync,
covered by test_pg_failover.py) with the Slurm cluster behind it. The server, the telemetry gateway and the
sweeps LISTEN to nothing: their pools reconnect (test_pg_failover_jobs.py).

Every poll is set to 120 s here, so a job confirmed after the failover can only be placed (the worker woken
by `tuneplane_job_queued`), its PREPARE and START delivered (the gateway woken by `tuneplane_node_commands`)
and its queued `launch` job taken (pgqueuer woken by its NOTIFY) within the bound below if the NOTIFYs
reach the new LISTEN connections. The agent keeps its control session throughout (the gateway did not lose
it), so no session start wakes delivery either.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.e2e.launch_cluster import MIB, TINY_MEMBER, Cluster
from tests.helpers import wait_for
from tests.pg_failover import available, failover_cluster
from tuneplane.app.db import Database

pytestmark = [pytest.mark.e2e, pytest.mark.skipif(available() is not None, reason=str(available()))]

POLL_S = "120"  # every fallback poll: far beyond the bound below
WOKEN_S = 45.0  # a launch woken by NOTIFYs takes seconds; only a missed NOTIFY waits for a 120 s poll
LISTENERS = ("tuneplane-node-gateway-listen", "tuneplane-worker-listen")


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
        try:
            cluster.start(gateway_args=("--poll-interval", POLL_S))
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

            pg.fail_over()
            # Listening again on the new primary (each ran its one poll then: nothing was pending).
            wait_for(lambda: set(LISTENERS) <= _listening(db), timeout=60, what="LISTEN on the new primary")
            wait_for(
                lambda: _count(db, "pg_stat_activity WHERE application_name = 'tuneplane-worker-queue'") == 1,
                timeout=60,
                what="the queue consumer on the new primary",
            )

            job_id = cluster.submit(spec)
            cluster.wait_members(job_id, "running", timeout=WOKEN_S)
            # Its `launch` queue job (enqueued with the reservation) was taken by the consumer, not left for
            # the 120 s dequeue timeout.
            wait_for(
                lambda: _count(db, "pgqueuer WHERE entrypoint = 'launch'") == 0,
                timeout=WOKEN_S,
                what="the launch queue job taken",
            )
            job = cluster.wait_job(job_id, ("succeeded", "failed", "cancelled"), timeout=WOKEN_S)
            assert job["state"] == "succeeded", cluster.diagnose(job_id)
            assert sum("connected to" in line for line in agent.out.lines) == sessions, agent.out.text()
        finally:
            cluster.stop_all()
            db.close()
