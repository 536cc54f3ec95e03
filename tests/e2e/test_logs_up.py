"""Against `tuneplane up` (real server, node gateway, local agent, worker, runner): a demo job's stdout
reaches the server through the agent's log shipper, and `tuneplane jobs logs --follow` prints it and stops
when the job has finished."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from app.db import Database
from tests.e2e.test_up_submit import free_port_run
from tests.helpers import OutputWatcher, wait_for

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]


def test_demo_output_is_shipped_and_followed_until_the_job_ends(
    db_url: str, db: Database, tmp_path: Path
) -> None:
    if "ship_logs" not in (REPO / "workers" / "agent" / "launch.py").read_text():
        pytest.skip("the agent's start handler does not run workers.agent.logship.ship_logs yet")
    port = free_port_run()
    env = {**os.environ, "TUNEPLANE_CONFIG": str(tmp_path / "config.toml"), "PYTHONUNBUFFERED": "1"}
    for name in ("TUNEPLANE_DATABASE_URL", "TUNEPLANE_SERVER", "TUNEPLANE_TOKEN", "TUNEPLANE_DATA_DIR"):
        env.pop(name, None)
    up = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "app",
            "up",
            "--database-url",
            db_url,
            "--data-dir",
            str(tmp_path / "data"),
            "--port",
            str(port),
        ],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    out = OutputWatcher(up)
    try:
        out.wait_for_line("TunePlane is up:", timeout=120)
        wait_for(
            lambda: db.fetch_one("SELECT count(*) AS n FROM nodes WHERE cpus > 0")["n"] > 0,
            timeout=60,
            what="the local node to report its capacity",
        )

        def cli(*args: str, **kw) -> subprocess.CompletedProcess:
            return subprocess.run(
                [sys.executable, "-m", "app", *args],
                cwd=REPO,
                env=env,
                capture_output=True,
                text=True,
                timeout=120,
                **kw,
            )

        receipt = cli(
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
        followed = cli("jobs", "logs", job_id, "--follow", "--poll", "0.2")
        assert followed.returncode == 0, followed.stderr
        assert db.fetch_one("SELECT state FROM jobs WHERE id = %s", (int(job_id),))["state"] == "succeeded"
        lines = followed.stdout.splitlines()
        assert [line.split()[1] for line in lines if line.startswith("step ")] == ["1/3", "2/3", "3/3"]
        assert lines[-1].startswith("done: 3 steps")
        # Everything was shipped once: the stored stream is exactly the runner's file.
        member = db.fetch_one("SELECT id FROM members WHERE job_id = %s", (int(job_id),))
        log_file = tmp_path / "data"
        files = list(log_file.rglob(f"members/{member['id']}/logs/stdout.log"))
        assert len(files) == 1
        assert followed.stdout == files[0].read_text()
        shown = cli("jobs", "show", job_id)
        assert "members:" in shown.stdout and "exited" in shown.stdout
    finally:
        os.killpg(up.pid, signal.SIGTERM)
        up.wait(timeout=60)
