"""Issue 7 end to end on `tuneplane up`: a demo job delivers its checkpoint as a verified artifact, and a
fine-tune job takes that checkpoint as its input (pinned by manifest digest in the preview), gets it
materialized and verified on the node, starts from those weights and succeeds."""

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


def _ended(db: Database, job_id: int) -> dict | None:
    row = db.fetch_one("SELECT state, state_reason FROM jobs WHERE id = %s", (job_id,))
    return row if row["state"] in ("succeeded", "failed", "cancelled") else None


def test_fine_tune_job_consumes_a_previous_jobs_checkpoint(db_url: str, db: Database, tmp_path: Path) -> None:
    with tuneplane_up(db_url, tmp_path, db) as up:
        user = add_user(db, "alice")
        resources = {"cpus_per_node": 1, "memory_per_node": "256M"}
        base_spec = {
            "recipe": {"name": "demo", "params": {"steps": 30, "step_seconds": 0.0}},
            "resources": resources,
            "outputs": [{"name": "checkpoint", "path": "checkpoint"}],
        }
        preview = service.create_preview(db, user, base_spec)
        base = service.confirm(db, user, preview["id"], preview["digest"], str(uuid.uuid4()))["job_id"]
        done = wait_for(lambda: _ended(db, base), timeout=90, what="the base job to end")
        assert done["state"] == "succeeded", (done, up.out.text()[-3000:])
        artifact = wait_for(
            lambda: db.fetch_one(
                "SELECT state, manifest_digest FROM artifacts WHERE job_id = %s AND name = 'checkpoint'"
                " AND state = 'complete'",
                (base,),
            ),
            timeout=60,
            what="the checkpoint artifact to be complete",
        )

        tune_spec = {
            "recipe": {
                "name": "demo",
                "params": {"steps": 10, "step_seconds": 0.0, "init_from": "base/model.npz"},
            },
            "resources": resources,
            "inputs": [{"name": "base", "artifact": f"{base}/checkpoint"}],
        }
        preview = service.create_preview(db, user, tune_spec)
        pinned = preview["resolved"]["inputs"][0]
        assert pinned["manifest_digest"] == artifact["manifest_digest"]
        tune = service.confirm(db, user, preview["id"], preview["digest"], str(uuid.uuid4()))["job_id"]
        done = wait_for(lambda: _ended(db, tune), timeout=90, what="the fine-tune job to end")
        assert done["state"] == "succeeded", (done, up.out.text()[-3000:])
        (member,) = db.fetch_all("SELECT id FROM members WHERE job_id = %s", (tune,))
        member_dir = up.data_dir / "node" / "work" / "members" / str(member["id"])
        assert (member_dir / "input" / "base" / "model.npz").is_file()
        stdout = (member_dir / "logs" / "stdout.log").read_text()
        assert "initialized from" in stdout and "base/model.npz" in stdout
