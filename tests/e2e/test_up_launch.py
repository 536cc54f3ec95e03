"""Against `tuneplane up` (console, both gateways, the worker, the local agent): a confirmed demo job is
placed, prepared, run by the runner, its metrics shipped by its collector, and it succeeds."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from tests.e2e.up_process import tuneplane_up
from tests.helpers import wait_for
from tests.submission_setup import add_user
from tuneplane.app.db import Database
from tuneplane.app.submission import service

pytestmark = pytest.mark.e2e


def test_a_demo_job_runs_to_success_on_tuneplane_up_and_ships_its_metrics(
    db_url: str, db: Database, tmp_path: Path
) -> None:
    with tuneplane_up(db_url, tmp_path, db) as up:
        user = add_user(db, "alice")
        spec = {
            "recipe": {"name": "demo", "params": {"steps": 20, "step_seconds": 0.0}},
            "resources": {"cpus_per_node": 1, "memory_per_node": "256M"},
        }
        preview = service.create_preview(db, user, spec)
        job_id = service.confirm(db, user, preview["id"], preview["digest"], str(uuid.uuid4()))["job_id"]

        def ended() -> dict | None:
            row = db.fetch_one("SELECT state, state_reason FROM jobs WHERE id = %s", (job_id,))
            return row if row["state"] in ("succeeded", "failed", "cancelled") else None

        job = wait_for(ended, timeout=90, what="the demo job to end")
        assert job["state"] == "succeeded", (job, up.out.text()[-3000:])
        wait_for(
            lambda: db.fetch_one(
                "SELECT count(*) AS n FROM telemetry_series WHERE job_id = %s AND canonical = 'loss'",
                (job_id,),
            )["n"],
            timeout=30,
            what="the demo's loss series shipped by its collector",
        )
        (member,) = db.fetch_all("SELECT id FROM members WHERE job_id = %s", (job_id,))
        logs = up.data_dir / "node" / "work" / "members" / str(member["id"]) / "logs"
        assert (logs / "stdout.log").stat().st_size > 0
