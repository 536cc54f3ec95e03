"""Issue 15 point 7: `tuneplane up` with one of its ports taken stops at once with one line naming the
port and the flags that choose others (no traceback, nothing started)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import pytest

from tests.e2e.up_process import LEAKY, REPO, free_port_run

pytestmark = pytest.mark.e2e


def _up(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in LEAKY}
    env["TUNEPLANE_CONFIG"] = str(tmp_path / "config.toml")
    return subprocess.run(
        [sys.executable, "-P", "-m", "tuneplane", "up", "--data-dir", str(tmp_path / "data"), *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def _one_line(result: subprocess.CompletedProcess) -> str:
    assert result.returncode != 0
    assert "Traceback" not in result.stderr + result.stdout
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    return lines[0]


def test_up_with_port_plus_one_taken_exits_with_one_line(tmp_path: Path) -> None:
    port = free_port_run()
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", port + 1))
        taken.listen()
        line = _one_line(_up(tmp_path, "--port", str(port)))
    assert f"port {port + 1}" in line and "node gateway" in line and "not TunePlane" in line
    assert "--port" in line and "--node-gateway-port" in line and "--telemetry-gateway-port" in line
    assert not (tmp_path / "data" / "postgres").exists()  # nothing was started


def test_up_names_a_tuneplane_already_answering_on_its_port(tmp_path: Path) -> None:
    class Healthz(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = json.dumps({"status": "ok", "database": "ok"}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *_args: object) -> None:
            pass

    port = free_port_run()
    server = HTTPServer(("127.0.0.1", port), Healthz)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        line = _one_line(_up(tmp_path, "--port", str(port)))
    finally:
        server.shutdown()
        server.server_close()
    assert f"port {port} " in line and "already running" in line


def test_up_refuses_two_roles_on_one_port(tmp_path: Path) -> None:
    port = free_port_run()
    line = _one_line(_up(tmp_path, "--port", str(port), "--telemetry-gateway-port", str(port + 1)))
    assert "would both use port" in line and "--telemetry-gateway-port" in line
