"""`tuneplane up` as a test fixture: a real process tree on the test's database, stopped at the end."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from tests.conftest import free_port
from tests.helpers import OutputWatcher, wait_for
from tuneplane.app.db import Database

REPO = Path(__file__).resolve().parents[2]
# Settings a developer's shell may carry that must not leak into the process under test.
LEAKY = (
    "TUNEPLANE_DATABASE_URL",
    "TUNEPLANE_DATA_DIR",
    "TUNEPLANE_SERVER",
    "TUNEPLANE_TOKEN",
    "TUNEPLANE_ENROLL_TOKEN",
    "TUNEPLANE_NODE_GATEWAY_URL",
    "TUNEPLANE_TELEMETRY_URL",
)


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


@dataclass
class Up:
    process: subprocess.Popen
    out: OutputWatcher
    env: dict[str, str]
    data_dir: Path
    url: str

    def cli(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
        """`tuneplane ARGS` as a user runs it, against this server (config written by `up`)."""
        return subprocess.run(
            [sys.executable, "-P", "-m", "tuneplane", *args],
            cwd=REPO,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )


@contextmanager
def tuneplane_up(db_url: str | None, tmp_path: Path, db: Database | None) -> Iterator[Up]:
    """Start `tuneplane up` on db_url; yield once the console answers and the local node has reported
    its capacity and probe port (before that, a preview finds no fleet that can hold a job).

    With db_url None, `up` runs its embedded PostgreSQL in the data directory; `db` may then be None and
    the test connects with `embedded_database(up)`."""
    env = {**os.environ, "TUNEPLANE_CONFIG": str(tmp_path / "config.toml"), "PYTHONUNBUFFERED": "1"}
    for name in LEAKY:
        env.pop(name, None)
    data_dir = tmp_path / "data"
    database = ["--database-url", db_url] if db_url else []
    process = subprocess.Popen(
        [
            sys.executable,
            "-P",
            "-m",
            "tuneplane",
            "up",
            *database,
            "--data-dir",
            str(data_dir),
            "--port",
            str(free_port_run()),
        ],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    out = OutputWatcher(process)
    own_db = None
    try:
        url = out.wait_for_line("TunePlane is up:", timeout=180).split("TunePlane is up:")[1].strip()
        up = Up(process, out, env, data_dir, url)
        if db is None:
            db = own_db = embedded_database(up)
        wait_for(
            lambda: db.fetch_one(
                "SELECT count(*) AS n FROM nodes n JOIN fleets f ON f.id = n.fleet_id"
                " WHERE f.name = 'local' AND n.cpus > 0 AND n.probe_port IS NOT NULL"
            )["n"],
            timeout=60,
            what="the local node's capacity and probe port",
        )
        yield up
    finally:
        if own_db is not None:
            own_db.close()
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(timeout=60)


def embedded_database(up: Up) -> Database:
    """A connection pool to the embedded PostgreSQL of an `up` started without a database URL."""
    return Database((up.data_dir / "run" / "postgres.url").read_text().strip(), max_size=2)
