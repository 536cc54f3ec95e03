"""Against `tuneplane up`: `tuneplane submit --recipe demo --yes --json --retry-key k1` prints a receipt,
and running it again with the same key prints the same job id."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from app.db import Database
from tests.conftest import free_port
from tests.helpers import OutputWatcher, wait_for

pytestmark = pytest.mark.e2e


def free_port_run(count: int = 3) -> int:
    """A port P with P..P+count-1 all free: `up` uses the console port and the next two."""
    for _ in range(50):
        base = free_port()
        sockets = []
        try:
            for offset in range(count):
                s = socket.socket()
                sockets.append(s)
                s.bind(("127.0.0.1", base + offset))
            return base
        except OSError:
            continue
        finally:
            for s in sockets:
                s.close()
    raise AssertionError("no run of free ports")


def test_submit_demo_twice_with_one_retry_key_is_one_job(
    db_url: str, db: Database, port: int, tmp_path: Path
) -> None:
    config = tmp_path / "config.toml"
    env = {**os.environ, "TUNEPLANE_CONFIG": str(config), "PYTHONUNBUFFERED": "1"}
    for name in (
        "TUNEPLANE_DATABASE_URL",
        "TUNEPLANE_SERVER",
        "TUNEPLANE_TOKEN",
        "TUNEPLANE_ENROLL_TOKEN",
        "TUNEPLANE_NODE_GATEWAY_URL",
    ):
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
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env=env,
    )
    out = OutputWatcher(up)
    try:
        out.wait_for_line("TunePlane is up:", timeout=120)
        if db.fetch_one("SELECT 1 AS x FROM fleets WHERE name = 'local'") is None:
            pytest.skip("tuneplane up made no `local` fleet yet (fleet and node area)")
        # The local agent reports its capacity right after it connects; a preview needs that capacity.
        wait_for(
            lambda: (
                db.fetch_one(
                    "SELECT count(*) AS n FROM nodes n JOIN fleets f ON f.id = n.fleet_id"
                    " WHERE f.name = 'local' AND n.cpus > 0"
                )["n"]
                > 0
            ),
            timeout=60,
            what="the local node to report its capacity",
        )

        def submit() -> dict:
            result = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "app",
                    "submit",
                    "--recipe",
                    "demo",
                    "--yes",
                    "--json",
                    "--retry-key",
                    "k1",
                ],
                capture_output=True,
                text=True,
                env=env,
                timeout=60,
            )
            assert result.returncode == 0, result.stdout + result.stderr
            return json.loads(result.stdout)

        first = submit()
        second = submit()
        assert first["job_id"] == second["job_id"]
        assert not first["replayed"] and second["replayed"]
        assert db.fetch_one("SELECT count(*) AS n FROM jobs")["n"] == 1
    finally:
        up.send_signal(signal.SIGTERM)
        up.wait(timeout=60)
