"""Issue 14 end to end on `tuneplane up`: a member's logs become a verified artifact of its attempt."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest

from app.db import Database
from app.submission import service
from tests.e2e.up_process import tuneplane_up
from tests.helpers import wait_for
from tests.submission_setup import add_user

pytestmark = pytest.mark.e2e
RESOURCES = {"cpus_per_node": 1, "memory_per_node": "256M"}


def _ended(db: Database, job_id: int) -> dict | None:
    row = db.fetch_one("SELECT state, state_reason FROM jobs WHERE id = %s", (job_id,))
    return row if row["state"] in ("succeeded", "failed", "cancelled") else None


def _submit(db: Database, user: int, spec: dict) -> int:
    preview = service.create_preview(db, user, spec)
    return service.confirm(db, user, preview["id"], preview["digest"], str(uuid.uuid4()))["job_id"]


def test_member_logs_are_an_artifact_that_downloads_and_verifies(
    db_url: str, db: Database, tmp_path: Path
) -> None:
    with tuneplane_up(db_url, tmp_path, db) as up:
        user = add_user(db, "alice")
        job = _submit(db, user, {"recipe": {"name": "demo", "params": {"steps": 20, "step_seconds": 0.0}},
                                 "resources": RESOURCES})  # fmt: skip
        done = wait_for(lambda: _ended(db, job), timeout=90, what="the job to end")
        assert done["state"] == "succeeded", (done, up.out.text()[-3000:])
        logs = wait_for(
            lambda: db.fetch_one(
                "SELECT * FROM artifacts WHERE job_id = %s AND name = 'logs' AND state = 'complete'", (job,)
            ),
            timeout=60,
            what="the logs artifact",
        )
        assert logs["kind"] == "logs" and logs["file_count"] == 2
        got = up.cli("artifacts", "download", str(job), "logs", str(tmp_path / "logs"))
        assert got.returncode == 0, got.stderr
        assert "done: 20 steps" in (tmp_path / "logs" / "stdout.log").read_text()
        checked = up.cli("artifacts", "verify", str(job), "logs", "--dir", str(tmp_path / "logs"), "--json")
        assert checked.returncode == 0 and json.loads(checked.stdout)["ok"], checked.stderr
