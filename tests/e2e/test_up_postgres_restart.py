"""`kill -9` of the embedded PostgreSQL under `tuneplane up` (issue 15 item 10, issue 16): the supervisor
restarts it like any other child, every component reconnects, running members are untouched, jobs
succeed with their metrics and their outputs — also when PostgreSQL dies at the moment a member exits 0
(5 rounds, a tiny member)."""

from __future__ import annotations

import io
import os
import signal
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import psycopg
import pytest

from tests.e2e.launch_cluster import MIB, TINY_MEMBER, source_archive
from tests.e2e.up_process import Up, embedded_database, tuneplane_up
from tests.helpers import wait_for
from tests.submission_setup import add_user
from tuneplane.app.blobstore import FilesystemBlobStore
from tuneplane.app.db import Database
from tuneplane.app.submission import archives, service

pytestmark = pytest.mark.e2e

T = TypeVar("T")
POINTS_BEFORE, POINTS_AFTER = 150, 150


def _quiet(query: Callable[[], T]) -> T | None:
    """A query that may meet the database restarting: None until it answers."""
    try:
        return query()
    except (psycopg.OperationalError, psycopg.InterfaceError):
        return None
    except Exception as exc:  # the pool's timeout while the server is down
        if type(exc).__name__ == "PoolTimeout":
            return None
        raise


def _postmaster(up: Up) -> int:
    return int((up.data_dir / "postgres" / "postmaster.pid").read_text().splitlines()[0])


def _kill_postgres(up: Up, restarts_before: int, meanwhile: Callable[[], object] | None = None) -> None:
    """kill -9 the postmaster, run `meanwhile`, and wait until the supervisor restarted PostgreSQL."""
    os.kill(_postmaster(up), signal.SIGKILL)
    if meanwhile is not None:
        meanwhile()
    wait_for(
        lambda: up.out.text().count("restarted postgres") > restarts_before,
        timeout=60,
        what="the supervisor to restart PostgreSQL",
    )
    assert up.process.poll() is None, up.out.text()[-3000:]


class Jobs:
    def __init__(self, up: Up, db: Database) -> None:
        self.up, self.db = up, db
        self.user = add_user(db, "alice")
        blobs = FilesystemBlobStore(up.data_dir / "blobs")
        archive = io.BytesIO(source_archive({"job.py": TINY_MEMBER}))
        facts = archives.receive_archive(db, blobs, self.user, archive)
        self.archive = facts.sha256

    def submit(self, flag: Path, before: int = 0, after: int = 0) -> int:
        spec = {
            "fleet": "local",
            "source": {"archive": self.archive, "entrypoint": "python job.py", "integration": "script"},
            "resources": {"nodes": 1, "cpus_per_node": 1, "memory_per_node": 64 * MIB},
            "env": {"RELEASE_FLAG": str(flag), "BEFORE": str(before), "AFTER": str(after)},
            "outputs": [{"name": "ckpt", "path": "ckpt"}],
        }
        preview = service.create_preview(self.db, self.user, spec)
        receipt = service.confirm(self.db, self.user, preview["id"], preview["digest"], str(uuid.uuid4()))
        return int(receipt["job_id"])

    def member(self, job_id: int) -> dict | None:
        return _quiet(lambda: self.db.fetch_one("SELECT * FROM members WHERE job_id = %s", (job_id,)))

    def member_dir(self, member: dict) -> Path:
        return self.up.data_dir / "node" / "work" / "members" / str(member["id"])

    def diagnose(self, job_id: int) -> str:
        rows = self.db.fetch_all("SELECT * FROM job_events WHERE job_id = %s ORDER BY id", (job_id,))
        lines = [f"job: {self.db.fetch_one('SELECT * FROM jobs WHERE id = %s', (job_id,))}"]
        lines += [f"member: {self.member(job_id)}", *(f"event: {r}" for r in rows)]
        return "\n".join([*lines, self.up.out.text()[-4000:]])

    def running(self, job_id: int) -> dict:
        try:
            member = wait_for(
                lambda: (m := self.member(job_id)) is not None and m["state"] == "running" and m,
                timeout=90,
                what=f"job {job_id}'s member running",
            )
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{self.diagnose(job_id)}") from None
        wait_for((self.member_dir(member) / "output" / "started").exists, timeout=30, what="workload start")
        return member

    def succeeded_with_checkpoint(self, job_id: int, what: str) -> None:
        def ended() -> dict | None:
            row = _quiet(lambda: self.db.fetch_one("SELECT * FROM jobs WHERE id = %s", (job_id,)))
            return row if row and row["state"] in ("succeeded", "failed", "cancelled") else None

        job = wait_for(ended, timeout=120, what=f"{what}: job {job_id} to end")
        assert job["state"] == "succeeded", (what, job["state_reason"], self.up.out.text()[-3000:])
        member = self.member(job_id)
        assert (member["state"], member["exit_code"]) == ("exited", 0), what
        wait_for(
            lambda: _quiet(
                lambda: self.db.fetch_one(
                    "SELECT 1 AS ok FROM artifacts WHERE job_id = %s AND name = 'ckpt'"
                    " AND state = 'complete'",
                    (job_id,),
                )
            ),
            timeout=120,
            what=f"{what}: the checkpoint artifact complete",
        )

    def points(self, job_id: int) -> int:
        row = _quiet(
            lambda: self.db.fetch_one(
                "SELECT count(*) AS n FROM telemetry_points p JOIN telemetry_series s ON s.id = p.series_id"
                " WHERE s.job_id = %s AND s.name = 'loss'",
                (job_id,),
            )
        )
        return row["n"] if row else -1


def test_embedded_postgres_killed_is_restarted_and_jobs_succeed_with_metrics_and_outputs(
    tmp_path: Path,
) -> None:
    with tuneplane_up(None, tmp_path, None) as up:
        db = embedded_database(up)
        try:
            jobs = Jobs(up, db)
            restarts = 0

            # During a running job: the member is untouched, the job succeeds, its metrics are complete.
            flag = tmp_path / "release-running"
            job_id = jobs.submit(flag, POINTS_BEFORE, POINTS_AFTER)
            member = jobs.running(job_id)
            wait_for(lambda: jobs.points(job_id) == POINTS_BEFORE, timeout=60, what="points before")
            _kill_postgres(up, restarts)
            restarts += 1
            again = wait_for(lambda: jobs.member(job_id), timeout=60, what="the database to answer")
            assert (again["state"], again["pid"], again["started_at"]) == (
                "running",
                member["pid"],
                member["started_at"],
            )
            flag.write_text("go")
            jobs.succeeded_with_checkpoint(job_id, "killed while running")
            wait_for(
                lambda: jobs.points(job_id) == POINTS_BEFORE + POINTS_AFTER,
                timeout=60,
                what="every metric point after the restart",
            )
            runner_log = (jobs.member_dir(member) / "logs" / "runner.log").read_text()
            assert runner_log.count("starting member") == 1

            # At the moment a member exits 0, five times.
            for round_ in range(5):
                flag = tmp_path / f"release-{round_}"
                job_id = jobs.submit(flag)
                member = jobs.running(job_id)
                if round_ % 2:  # PostgreSQL goes first, then the member exits
                    _kill_postgres(up, restarts, meanwhile=lambda flag=flag: flag.write_text("go"))
                else:  # the member exits, PostgreSQL dies right then
                    flag.write_text("go")
                    wait_for((jobs.member_dir(member) / "exit_status.json").exists, timeout=20, what="exit")
                    _kill_postgres(up, restarts)
                restarts += 1
                jobs.succeeded_with_checkpoint(job_id, f"round {round_}")
            assert "stopping TunePlane" not in up.out.text()
        finally:
            db.close()
