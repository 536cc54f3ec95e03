"""`tuneplane up` as a user runs it: a real process tree, a real embedded PostgreSQL, real signals."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

import psutil
import pytest

from tests.helpers import OutputWatcher, wait_for

pytestmark = pytest.mark.e2e


def _start_up(data_dir: Path, port: int, config: Path) -> tuple[subprocess.Popen, OutputWatcher]:
    env = {**os.environ, "TUNEPLANE_CONFIG": str(config)}
    env.pop("TUNEPLANE_DATABASE_URL", None)
    process = subprocess.Popen(
        [sys.executable, "-P", "-m", "tuneplane", "up", "--data-dir", str(data_dir), "--port", str(port)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env=env,
    )
    return process, OutputWatcher(process)


def _postgres_processes(pgdata: Path) -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter(["cmdline", "status"]):
        try:
            cmdline = " ".join(proc.info["cmdline"] or [])
            if (
                "postgres" in cmdline
                and str(pgdata) in cmdline
                and proc.info["status"] != psutil.STATUS_ZOMBIE
            ):
                found.append(proc)
        except psutil.Error:
            continue
    return found


def _alive(pids: list[int]) -> list[int]:
    alive = []
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                alive.append(pid)
        except psutil.NoSuchProcess:
            pass
    return alive


def test_up_serves_healthz_then_sigterm_leaves_nothing_running(tmp_path: Path, port: int) -> None:
    data_dir, config = tmp_path / "data", tmp_path / "config.toml"
    process, out = _start_up(data_dir, port, config)
    try:
        url = out.wait_for_line("TunePlane is up:", timeout=120).split("TunePlane is up:")[1].strip()
        with urllib.request.urlopen(f"{url}/healthz", timeout=5) as response:
            assert response.status == 200
        # The lines after "TunePlane is up" are printed by the same flush but read by the watcher's
        # thread one at a time, so each is waited for rather than looked up once (CI saw it missing).
        out.wait_for_line(f"node gateway: http://127.0.0.1:{port + 1}", timeout=10)
        assert f"telemetry gateway: http://127.0.0.1:{port + 2}" in out.text()
        out.wait_for_line("admin login: admin /", timeout=10)
        # A fresh install applies every migration: said in one line, not one line per file.
        assert "applied " in out.text() and "applying 0" not in out.text()
        assert "applying the stored functions (" in out.text() and "common.sql" not in out.text()
        assert f'server = "{url}"' in config.read_text() and "token = " in config.read_text()
        assert oct(config.stat().st_mode & 0o777) == "0o600"
        children = [p.pid for p in psutil.Process(process.pid).children(recursive=True)]
        postgres = [p.pid for p in _postgres_processes(data_dir / "postgres")]
        assert children and postgres
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=60)
    assert process.returncode == 0, out.text()
    wait_for(lambda: not _alive(children + postgres), timeout=30, what="every child and postgres to exit")
    assert _postgres_processes(data_dir / "postgres") == []

    # A second `up` on the same data directory reuses the data: no new admin, same config.
    process, out = _start_up(data_dir, port, config)
    try:
        out.wait_for_line("TunePlane is up:", timeout=120)
        out.wait_for_line("press Ctrl-C to stop", timeout=10)  # printed after where the admin line goes
        # No new admin; the password is not printed again, but where it is kept is.
        assert "admin login: admin /" not in out.text()
        assert f"admin login: see {data_dir / 'initial-admin.txt'}" in out.text()
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=60)
    assert process.returncode == 0
    wait_for(lambda: not _postgres_processes(data_dir / "postgres"), timeout=30, what="postgres to stop")
