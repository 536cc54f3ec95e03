"""The Slurm backend rides out a PostgreSQL failover (issue 33): the Slurm worker (tests/e2e/test_slurm.py's
harness: a real slurmctld and two slurmd, the worker in a thread) runs against a primary with a
synchronous standby through the multi-host URL (tests/pg_failover.py), its poll at 120 s so that only
NOTIFYs and its one pass after re-LISTENing can move anything within the bounds below.

A two-member job is running when the primary is killed (kill -9); the standby is promoted DOWN_S later.
Then, before the worker listens again (its LISTEN back-off is at 5 s by then), a job is confirmed on the new
primary: its NOTIFY reaches nobody, and only the pass the worker runs when it listens again submits it. A
job confirmed after that is woken by its NOTIFY. The running job's members are released only then (its
end, recorded on the new primary, would NOTIFY a placement and wake the worker too). All three succeed.
Printed (bench-style): kill -> the sbatch of each job confirmed after the failover.
"""

from __future__ import annotations

import time
from pathlib import Path

import psycopg
import pytest

from tests.e2e.test_slurm import Harness
from tests.pg_failover import available, failover_cluster
from tuneplane.app.db import Database

pytestmark = [pytest.mark.e2e, pytest.mark.skipif(available() is not None, reason=str(available()))]


POLL_S = 120.0  # the worker's fallback poll: far beyond the bounds below
WOKEN_S = 30.0  # an sbatch woken by NOTIFY takes a second or two; only a missed NOTIFY waits for the poll
# The outage: the worker's LISTEN back-off (0.25 s doubling to 5 s) tries at 0.25 … 7.75, 12.75 s, so a
# promotion at 8 s (or 13 s, when the standby's own WAL retry delays it) leaves ~4.7 s before it listens.
DOWN_S = 8.0


def _listening(db: Database) -> set[str]:
    try:
        rows = db.fetch_all("SELECT application_name FROM pg_stat_activity WHERE query LIKE 'LISTEN%%'")
    except psycopg.Error:  # the pool meets the failover
        return set()
    return {r["application_name"] for r in rows}


# A member that runs until its flag file exists.
WAITING = b"""import os, pathlib, time
flag = pathlib.Path(os.environ["FLAG"])
while not flag.exists():
    time.sleep(0.1)
"""


def _sbatched(harness: Harness, job_id: int, what: str) -> float:
    harness.wait(lambda: harness.slurm_id(job_id) is not None, what, WOKEN_S)
    return time.time()


def test_a_slurm_job_runs_through_a_failover_and_jobs_after_it_launch(slurm_cluster, tmp_path: Path) -> None:
    with failover_cluster() as pg:
        db = Database(pg.url, name="tuneplane-test")
        harness = Harness(
            db, pg.url, slurm_cluster, tmp_path, files={"wait.py": WAITING}, poll_interval=POLL_S
        )
        fresh: Database | None = None
        try:
            harness.start()
            flag = harness.shared / "release"
            source = {"archive": f"sha256:{harness.sha}", "entrypoint": "python wait.py"}
            running = harness.submit(source=source, env={"FLAG": str(flag)})
            harness.wait_state(running, "running", timeout=90)

            pg.fail_over(DOWN_S)
            killed = pg.killed_at
            assert killed is not None
            # A new pool reaches the new primary at once (the old one is still backing off).
            harness.db = fresh = Database(pg.url, name="tuneplane-test-after")
            missed = harness.submit()
            confirmed = time.time()
            # Its NOTIFY went out before the worker listened again: only the worker's pass after
            # re-LISTENing submits it.
            harness.wait(lambda: "tuneplane-slurm-worker-listen" in _listening(fresh), "LISTEN again")
            listened = fresh.fetch_one(
                "SELECT extract(epoch FROM backend_start) AS t FROM pg_stat_activity"
                " WHERE application_name = 'tuneplane-slurm-worker-listen'"
            )["t"]
            assert float(listened) > confirmed, (
                "the worker listened again before the confirmation: no missed NOTIFY"
            )
            missed_at = _sbatched(harness, missed, "the sbatch of the job whose NOTIFY was missed")
            # A confirmation now is heard: its NOTIFY wakes the worker's pass.
            after = harness.submit()
            after_at = _sbatched(harness, after, "the sbatch of a job confirmed after re-LISTEN")
            flag.write_text("go")
            for job_id in (running, missed, after):
                job = harness.wait_state(job_id, "succeeded", "failed", "cancelled", timeout=120)
                assert job["state"] == "succeeded", (job["state_reason"], harness.lines[-15:])
            assert fresh.fetch_one("SELECT inet_server_port() AS p")["p"] == pg.standby.port
            print(
                f"\nslurm failover (pg_ctl promote {DOWN_S:.0f} s later): kill -> sbatch of a job confirmed "
                f"before the worker listened again <= {missed_at - killed:.2f} s, of one confirmed after "
                f"<= {after_at - killed:.2f} s"
            )
        finally:
            harness.stop()
            slurm_cluster.run("scancel", "--full", "-u", "root", check=False)
            db.close()
            if fresh is not None:
                fresh.close()
