"""Real processes for the node tests: `tuneplane node-gateway`, `tuneplane node` agents and the worker
(which runs the sweeps: the connectivity events among them)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.helpers import OutputWatcher
from tuneplane.workers.proctree import PROC

REPO = Path(__file__).resolve().parents[2]


def env() -> dict[str, str]:
    values = {**os.environ, "PYTHONUNBUFFERED": "1", "TUNEPLANE_LOG_LEVEL": "INFO"}
    for name in ("TUNEPLANE_DATABASE_URL", "TUNEPLANE_NODE_GATEWAY_URL", "TUNEPLANE_ENROLL_TOKEN"):
        values.pop(name, None)
    return values


class Proc:
    """A child process whose output is collected (stdout and stderr together)."""

    def __init__(self, argv: list[str], extra_env: dict[str, str] | None = None) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-P", "-m", "tuneplane", *argv],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            cwd=REPO,
            env={**env(), **(extra_env or {})},
        )
        self.out = OutputWatcher(self.process)

    def wait_line(self, needle: str, timeout: float = 60.0) -> str:
        return self.out.wait_for_line(needle, timeout)

    def exit_code(self, timeout: float = 60.0) -> int:
        return self.process.wait(timeout)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def start_gateway(db_url: str, port: int, *extra: str, extra_env: dict[str, str] | None = None) -> Proc:
    """`extra_env`: the gateway's own variables (an S3 store's credentials: the server's alone)."""
    proc = Proc(
        ["node-gateway", "--database-url", db_url, "--port", str(port), "--poll-interval", "0.5", *extra],
        extra_env,
    )
    proc.wait_line("node gateway listening on")
    return proc


def start_worker(db_url: str, data_dir: Path) -> Proc:
    proc = Proc(
        ["worker", "--backend", "node", "--database-url", db_url, "--data-dir", str(data_dir),
         "--poll-interval", "0.3"]
    )  # fmt: skip
    proc.wait_line("consuming `launch`")
    return proc


def start_agent(server: str, state_dir: Path, *extra: str, token: str | None = None) -> Proc:
    argv = ["node", "--server", server, "--state-dir", str(state_dir), "--max-backoff", "1", *extra]
    if token:
        argv += ["--enroll-token", token]
    return Proc(argv)


def zombies_under(pid: int) -> list[int]:
    """Children of `pid` that ended and were never waited for (state Z in /proc)."""
    found = []
    for entry in PROC.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rpartition(")")[2].split()
        except OSError:
            continue
        if int(fields[1]) == pid and fields[0] == "Z":
            found.append(int(entry.name))
    return found
