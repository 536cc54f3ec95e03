"""The three servers (console, node gateway, telemetry gateway) as real processes on loopback, each
logging to its own file, for tests that need their memory (RSS) or their logs (no tracebacks)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from tests.conftest import free_port
from tests.e2e.up_process import LEAKY
from tests.helpers import wait_for


@dataclass
class ServerProcess:
    name: str
    url: str
    process: subprocess.Popen
    log: Path

    def rss_bytes(self) -> int:
        for line in Path(f"/proc/{self.process.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
        raise AssertionError("no VmRSS")

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")


@dataclass
class Servers:
    console: ServerProcess
    node_gateway: ServerProcess
    telemetry_gateway: ServerProcess
    all: list[ServerProcess] = field(default_factory=list)


def _start(name: str, args: list[str], port: int, env: dict, log_dir: Path) -> ServerProcess:
    log = log_dir / f"{name}.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            [sys.executable, "-P", "-m", "tuneplane", *args, "--host", "127.0.0.1", "--port", str(port)],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )
    return ServerProcess(name, f"http://127.0.0.1:{port}", process, log)


def _healthy(server: ServerProcess) -> bool:
    if server.process.poll() is not None:
        raise AssertionError(f"{server.name} exited: {server.log_text()[-2000:]}")
    try:
        return httpx.get(server.url + "/healthz", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


@contextmanager
def running_servers(
    db_url: str, data_dir: Path, *, names: tuple[str, ...] | None = None, console_args: tuple[str, ...] = ()
) -> Iterator[Servers]:
    env = {k: v for k, v in os.environ.items() if k not in LEAKY}
    env.update({"TUNEPLANE_DATABASE_URL": db_url, "TUNEPLANE_DATA_DIR": str(data_dir)})
    data_dir.mkdir(parents=True, exist_ok=True)
    specs = {
        "console": ["server", "--threads", "4", *console_args],
        "node_gateway": ["node-gateway", "--poll-interval", "1"],
        "telemetry_gateway": ["telemetry-gateway"],
    }
    wanted = names or tuple(specs)
    started = {name: _start(name, specs[name], free_port(), env, data_dir) for name in wanted}
    try:
        for server in started.values():
            wait_for(lambda s=server: _healthy(s), timeout=60, what=f"{server.name} /healthz")
        yield Servers(
            started.get("console"),  # type: ignore[arg-type]
            started.get("node_gateway"),  # type: ignore[arg-type]
            started.get("telemetry_gateway"),  # type: ignore[arg-type]
            list(started.values()),
        )
    finally:
        for server in started.values():
            if server.process.poll() is None:
                os.killpg(server.process.pid, signal.SIGTERM)
        for server in started.values():
            try:
                server.process.wait(15)
            except subprocess.TimeoutExpired:
                os.killpg(server.process.pid, signal.SIGKILL)
                server.process.wait(5)
