"""The Slurm backend rides out a PostgreSQL failover (issue 33): the Slurm worker (tests/e2e/test_slurm.py's
harness: a real slurmctld and two slurmd, the worker in a thread) runs against a primary with a
synchronous standby through the multi-host URL (tests/pg_failover.py). A two-member job is running when the
primary is killed (kill -9) and the standby promoted: the job goes on in Slurm and its end is recorded on
the new primary; the worker LISTENs again there, and a job confirmed after the failover is submitted to
Slurm and succeeds. Printed (bench-style): kill -> that job's sbatch recorded.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.e2e.test_slurm import Harness
from tests.pg_failover import available, failover_cluster
from tuneplane.app.db import Database

pytestmark = [pytest.mark.e2e, pytest.mark.skipif(available() is not None, reason=str(available()))]


def test_a_slurm_job_runs_through_a_failover_and_jobs_after_it_launch(slurm_cluster, tmp_path: Path) -> None:
    with failover_cluster() as pg:
        db = Database(pg.url, name="tuneplane-test")
        harness = Harness(db, pg.url, slurm_cluster, tmp_path)
        try:
            harness.start()
            running = harness.submit(env={"SLEEP": "6"})
            harness.wait_state(running, "running", timeout=90)

            pg.fail_over()
            killed = pg.killed_at
            assert killed is not None
            after = harness.submit()  # on the new primary, through the same pool
            harness.wait(lambda: harness.slurm_id(after) is not None, "sbatch of the job after the failover")
            sbatched = time.time()
            for job_id in (running, after):
                job = harness.wait_state(job_id, "succeeded", "failed", "cancelled", timeout=120)
                assert job["state"] == "succeeded", (job["state_reason"], harness.lines[-15:])
            listening = db.fetch_all(
                "SELECT application_name FROM pg_stat_activity WHERE query LIKE 'LISTEN%%'"
            )
            assert "tuneplane-slurm-worker-listen" in {r["application_name"] for r in listening}
            assert db.fetch_one("SELECT inet_server_port() AS p")["p"] == pg.standby.port
            print(
                f"\nslurm failover: kill -> sbatch of a job confirmed after it <= {sbatched - killed:.2f} s"
            )
        finally:
            harness.stop()
            slurm_cluster.run("scancel", "--full", "-u", "root", check=False)
            db.close()
