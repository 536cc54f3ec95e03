"""`tuneplane up` starts the node gateway and one local agent in fleet `local`, and the next `up` reuses
the agent's credential (same node, no new enrollment)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import OutputWatcher, wait_for
from tuneplane.app.db import Database

pytestmark = pytest.mark.e2e


def _up(db_url: str, data_dir: Path, port: int, config: Path) -> tuple[subprocess.Popen, OutputWatcher]:
    env = {**os.environ, "TUNEPLANE_CONFIG": str(config), "PYTHONUNBUFFERED": "1"}
    for name in ("TUNEPLANE_DATABASE_URL", "TUNEPLANE_NODE_GATEWAY_URL", "TUNEPLANE_ENROLL_TOKEN"):
        env.pop(name, None)
    process = subprocess.Popen(
        [
            sys.executable,
            "-P",
            "-m",
            "tuneplane",
            "up",
            "--database-url",
            db_url,
            "--data-dir",
            str(data_dir),
            "--port",
            str(port),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env=env,
    )
    return process, OutputWatcher(process)


def _stop(process: subprocess.Popen) -> None:
    process.send_signal(signal.SIGTERM)
    process.wait(timeout=60)


def test_up_runs_a_gateway_and_a_local_agent_and_reuses_its_credential(
    db_url: str, db: Database, port: int, tmp_path: Path
) -> None:
    data_dir, config = tmp_path / "data", tmp_path / "config.toml"

    def local_node() -> dict | None:
        return db.fetch_one("SELECT * FROM v_nodes WHERE fleet = 'local' AND node = 'local'")

    process, out = _up(db_url, data_dir, port, config)
    try:
        out.wait_for_line("TunePlane is up:", timeout=120)
        wait_for(
            lambda: (local_node() or {}).get("connectivity") == "connected" and local_node()["cpus"] > 0,
            timeout=30,
            what="the local node connected with capacity",
        )
        first_id = local_node()["node_id"]
        credential = data_dir / "node" / "state" / "node-credential.json"
        assert oct(credential.stat().st_mode & 0o777) == "0o600"
    finally:
        _stop(process)
    assert db.fetch_one("SELECT count(*) AS n FROM enrollment_tokens")["n"] == 1

    process, out = _up(db_url, data_dir, port, config)
    try:
        out.wait_for_line("TunePlane is up:", timeout=120)
        wait_for(
            lambda: (
                db.fetch_one("SELECT count(*) AS n FROM node_events WHERE kind = 'session_opened'")["n"] >= 2
            ),
            timeout=30,
            what="the agent's second session",
        )
    finally:
        _stop(process)
    assert local_node()["node_id"] == first_id
    assert db.fetch_one("SELECT count(*) AS n FROM enrollment_tokens")["n"] == 1  # no new token
    assert db.fetch_one("SELECT count(*) AS n FROM nodes")["n"] == 1
