"""Against `tuneplane up` (real server, node gateway, local agent, worker, runner): a demo job's stdout
reaches the server through the agent's log shipper, and `tuneplane jobs logs --follow` prints it and stops
when the job has finished."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.e2e.up_process import tuneplane_up
from tuneplane.app.db import Database

pytestmark = pytest.mark.e2e


def test_demo_output_is_shipped_and_followed_until_the_job_ends(
    db_url: str, db: Database, tmp_path: Path
) -> None:
    with tuneplane_up(db_url, tmp_path, db) as up:
        receipt = up.cli(
            "submit",
            "--recipe",
            "demo",
            "--param",
            "steps=3",
            "--param",
            "step_seconds=0.2",
            "--gpus-per-node",
            "0",
            "--memory",
            "256M",
            "--yes",
            "--json",
        )
        assert receipt.returncode == 0, receipt.stdout + receipt.stderr
        job_id = str(json.loads(receipt.stdout)["job_id"])
        followed = up.cli("jobs", "logs", job_id, "--follow", "--poll", "0.2")
        assert followed.returncode == 0, followed.stderr
        assert db.fetch_one("SELECT state FROM jobs WHERE id = %s", (int(job_id),))["state"] == "succeeded"
        lines = followed.stdout.splitlines()
        assert [line.split()[1] for line in lines if line.startswith("step ")] == ["1/3", "2/3", "3/3"]
        assert lines[-1].startswith("done: 3 steps")
        # Everything was shipped once: the stored stream is exactly the runner's file.
        member = db.fetch_one("SELECT id FROM members WHERE job_id = %s", (int(job_id),))
        files = list(up.data_dir.rglob(f"members/{member['id']}/logs/stdout.log"))
        assert len(files) == 1
        assert followed.stdout == files[0].read_text()
        shown = up.cli("jobs", "show", job_id)
        assert "members:" in shown.stdout and "exited" in shown.stdout
