"""Jobs ride out a PostgreSQL failover (issue 33 acceptance): a node gateway, a telemetry gateway, a node
worker and two agents run against a primary with a synchronous standby through the multi-host URL
(tests/pg_failover.py). Two jobs run and their collectors ship metrics; a burst of confirmations is in
flight; the primary dies (kill -9 of the postmaster and every backend) and the standby is promoted
DOWN_S later — longer than the cluster's lost_after (3 s), so a heartbeat clock that counted the outage
would mark both nodes lost; the test sweeps on the new primary the moment it is promoted, before any
heartbeat reached it (_sweep_at_once), so that this is decided, not left to a race between the sweeper's
and the gateway's reconnects (without coordinator_clock the test fails there).

After it: every confirmation that returned a receipt exists; no GPU or CPU is allocated twice; every
metric point is stored once; the running members were never restarted and their jobs succeed; no member
lost contact; jobs confirmed after the failover are admitted and launched; every long-lived process
LISTENs again on the new primary. Printed (bench-style, not asserted): kill -> first confirmation
confirmed after the kill, and -> first launch (a member running) of a job confirmed after the kill.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import psycopg
import pytest

from tests.e2e.launch_cluster import MIB, TINY_MEMBER, Cluster
from tests.helpers import wait_for
from tests.launch_fixtures import assert_no_gpu_allocated_twice
from tests.pg_failover import available, failover_cluster
from tuneplane.app.db import Database
from tuneplane.app.submission import service

pytestmark = [pytest.mark.e2e, pytest.mark.skipif(available() is not None, reason=str(available()))]

T = TypeVar("T")
DOWN_S = 5.0
BEFORE, AFTER = 100, 100
BURST_MAX = 12


def _quiet(query: Callable[[], T]) -> T | None:
    """A query that may meet the failover: None until the new primary answers."""
    try:
        return query()
    except psycopg.Error:  # psycopg_pool.PoolTimeout is one too
        return None


def _spec(archive: str, flag: Path, before: int = 0, after: int = 0) -> dict:
    return {
        "source": {"archive": archive, "entrypoint": "python job.py", "integration": "script"},
        "resources": {"nodes": 1, "gpus_per_node": 0, "cpus_per_node": 1, "memory_per_node": 64 * MIB},
        "env": {"RELEASE_FLAG": str(flag), "BEFORE": str(before), "AFTER": str(after)},
    }


class _Confirmations(threading.Thread):
    """Preview + confirm, again and again across the kill, on its own pool: the receipts it got, each with
    the time its confirm call began and returned."""

    def __init__(self, url: str, user_id: int, spec: dict) -> None:
        super().__init__(daemon=True)
        self.db = Database(url, name="tuneplane-test-burst")
        self.user_id, self.spec = user_id, spec
        self.receipts: list[tuple[int, float, float]] = []
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set() and len(self.receipts) < BURST_MAX:
            began = time.time()
            try:
                preview = service.create_preview(self.db, self.user_id, self.spec)
                receipt = service.confirm(
                    self.db, self.user_id, preview["id"], preview["digest"], str(uuid.uuid4())
                )
            except psycopg.Error:
                self.stop.wait(0.1)
                continue
            self.receipts.append((int(receipt["job_id"]), began, time.time()))
            self.stop.wait(0.3)


def _points(db: Database, job_id: int) -> tuple[int, int] | None:
    row = _quiet(
        lambda: db.fetch_one(
            "SELECT count(*) AS n, count(DISTINCT p.step) AS steps FROM telemetry_points p"
            " JOIN telemetry_series s ON s.id = p.series_id WHERE s.job_id = %s AND s.name = 'loss'",
            (job_id,),
        )
    )
    return (row["n"], row["steps"]) if row else None


def _sweep_at_once(url: str) -> None:
    """The heartbeat clock's worst moment: a sweep on the new primary as soon as it is promoted, before any
    heartbeat reached it (the gateway's pool is still backing off after the kill; a sweeper that
    reconnected first would do the same). Every node has been silent longer than lost_after by then; only
    coordinator_clock (migration 0250) keeps the sweep from marking them lost. Without it this sweep marks
    both running members lost and the checks below fail."""
    with psycopg.connect(url, autocommit=True) as conn:
        silent = conn.execute(
            "SELECT count(*) FROM tuneplane.nodes n, tuneplane.node_settings s"
            " WHERE n.last_heartbeat_at <= now() - s.lost_after"
        ).fetchone()[0]
        lost = conn.execute("SELECT tuneplane.sweep_lost_nodes()").fetchone()[0]
    assert silent == 2, f"a heartbeat reached the new primary first ({silent} of 2 nodes silent)"
    assert lost == 0, f"the coordinator's outage marked {lost} member(s) lost"


def test_jobs_ride_out_a_primary_killed_and_a_standby_promoted(tmp_path: Path, port: int) -> None:
    with failover_cluster() as pg:
        db = Database(pg.url, name="tuneplane-test")
        cluster = Cluster(pg.url, db, tmp_path, port)
        burst: _Confirmations | None = None
        try:
            cluster.start()
            telemetry = cluster.start_telemetry_gateway()
            for name in ("a", "b"):
                cluster.start_agent(name, "--telemetry-url", telemetry)
            cluster.start_worker()
            archive = cluster.upload_source({"job.py": TINY_MEMBER})
            flags = [tmp_path / f"release-{i}" for i in range(2)]
            running = [cluster.submit(_spec(archive, flag, BEFORE, AFTER)) for flag in flags]
            members = {j: cluster.wait_members(j, "running", timeout=90)[0] for j in running}
            for job_id in running:
                wait_for(lambda j=job_id: _points(db, j) == (BEFORE, BEFORE), timeout=60, what="points")
            done = tmp_path / "done"  # the burst's jobs end as soon as they start
            done.write_text("go")
            burst = _Confirmations(pg.url, cluster.user_id, _spec(archive, done))
            burst.start()
            wait_for(lambda: len(burst.receipts) >= 2, timeout=60, what="confirmations in flight")

            pg.fail_over(DOWN_S)
            killed, promoted = pg.killed_at, pg.promoted_at
            assert killed is not None and promoted is not None
            _sweep_at_once(pg.url)
            # The running members' workloads go on: release them now, during the outage's aftermath.
            for flag in flags:
                flag.write_text("go")

            def confirmed_after_kill() -> list[tuple[int, float, float]]:
                """Receipts of confirmations begun after the kill: the old primary, every process of it
                with a SIGKILL pending (kill_primary), served none of them; only the new one could."""
                return [r for r in burst.receipts if r[1] > killed]

            wait_for(confirmed_after_kill, timeout=120, what="a confirmation after the failover")
            first_confirm = min(done_at for _j, _b, done_at in confirmed_after_kill())
            burst.stop.set()
            burst.join(60)
            after_ids = [j for j, _b, _d in confirmed_after_kill()]

            def first_launch() -> float | None:
                row = _quiet(
                    lambda: db.fetch_one(
                        "SELECT extract(epoch FROM min(started_at)) AS t FROM members"
                        " WHERE job_id = ANY(%s) AND started_at IS NOT NULL",
                        (after_ids,),
                    )
                )
                return float(row["t"]) if row and row["t"] is not None else None

            launched = wait_for(first_launch, timeout=120, what="a job confirmed after the failover launched")
            print(
                f"\nfailover (kill -9, pg_ctl promote {DOWN_S:.0f} s later, standby promoted "
                f"{promoted - killed:.2f} s after the kill): "
                f"kill -> first confirmation {first_confirm - killed:.2f} s "
                f"({first_confirm - promoted:.2f} s after promotion); "
                f"kill -> first launch {launched - killed:.2f} s "
                f"({launched - promoted:.2f} s after promotion)"
            )

            # The running jobs end right, never restarted, with every metric point stored once.
            for job_id in running:
                job = cluster.wait_job(job_id, ("succeeded", "failed", "cancelled"), timeout=120)
                assert job["state"] == "succeeded", cluster.diagnose(job_id)
                (member,) = cluster.members(job_id)
                before = members[job_id]
                assert (member["id"], member["pid"], member["started_at"]) == (
                    before["id"], before["pid"], before["started_at"],
                )  # fmt: skip
                runner_log = (
                    cluster.member_dir(member["node"], member["id"]) / "logs" / "runner.log"
                ).read_text()
                assert runner_log.count("starting member") == 1
                wait_for(
                    lambda j=job_id: _points(db, j) == (BEFORE + AFTER, BEFORE + AFTER),
                    timeout=60,
                    what="every metric point, once",
                )
            # Every receipt names a job that exists; the ones after the failover were admitted and launched.
            receipts = [j for j, _b, _d in burst.receipts]
            stored = {r["id"] for r in db.fetch_all("SELECT id FROM jobs WHERE id = ANY(%s)", (receipts,))}
            assert stored == set(receipts)
            for job_id in after_ids:
                job = cluster.wait_job(job_id, ("succeeded", "failed", "cancelled"), timeout=120)
                assert job["state"] == "succeeded", cluster.diagnose(job_id)
            # Nobody was marked lost for the coordinator's outage, and nothing is held twice.
            assert db.fetch_all("SELECT id FROM members WHERE contact_lost_at IS NOT NULL") == []
            assert (
                db.fetch_all("SELECT job_id, reason FROM job_events WHERE reason LIKE '%%contact lost%%'")
                == []
            )
            assert_no_gpu_allocated_twice(db)
            # Every long-lived process LISTENs again, on the new primary.
            listening = {
                r["application_name"]
                for r in db.fetch_all(
                    "SELECT application_name FROM pg_stat_activity WHERE query LIKE 'LISTEN%%'"
                )
            }
            assert {"tuneplane-node-gateway-listen", "tuneplane-worker-listen"} <= listening, listening
            assert db.fetch_one("SELECT inet_server_port() AS p")["p"] == pg.standby.port
        finally:
            if burst is not None:
                burst.stop.set()
                burst.join(30)
                burst.db.close()
            cluster.stop_all()
            db.close()
