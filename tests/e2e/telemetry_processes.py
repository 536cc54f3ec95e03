"""Real processes for the telemetry end-to-end tests: the gateway and the collector, and what the files
say should be stored (read with TensorBoard's own loader and json, independently of the collector)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

import httpx

from tests.helpers import wait_for

REPO = Path(__file__).resolve().parents[2]


def _env() -> dict[str, str]:
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "TUNEPLANE_LOG_LEVEL": "INFO"}
    env.pop("TUNEPLANE_DATABASE_URL", None)
    return env


def start_gateway(database_url: str, port: int, log_path: Path) -> subprocess.Popen:
    with open(log_path, "ab") as log:
        process = subprocess.Popen(
            [
                sys.executable,
                "-P",
                "-m",
                "tuneplane",
                "telemetry-gateway",
                "--database-url",
                database_url,
                "--port",
                str(port),
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=REPO,
            env=_env(),
        )

    def healthy() -> bool:
        if process.poll() is not None:
            raise AssertionError(f"gateway exited: {log_path.read_text()[-2000:]}")
        try:
            return httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    wait_for(healthy, timeout=30, what="telemetry gateway healthy")
    return process


def start_collector(
    out: Path, spool: Path, gateway_url: str, token: str, log_path: Path, *extra: str
) -> subprocess.Popen:
    with open(log_path, "ab") as log:
        return subprocess.Popen(
            [
                sys.executable,
                "-P",
                "-m",
                "tuneplane",
                "collector",
                "--output-dir",
                str(out),
                "--spool-dir",
                str(spool),
                "--gateway",
                gateway_url,
                "--token",
                token,
                "--poll-interval",
                "0.1",
                "--fsync-interval",
                "0.1",
                *extra,
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=REPO,
            env=_env(),
        )


def kill9(process: subprocess.Popen) -> None:
    process.send_signal(signal.SIGKILL)
    process.wait(10)


def stop(process: subprocess.Popen, timeout: float = 60) -> int:
    if process.poll() is None:
        process.terminate()
    return process.wait(timeout)


def expected_points(out: Path) -> Counter:
    """(source, name, step, value) for every scalar in the output directory's files."""
    from tensorboard.backend.event_processing.event_file_loader import RawEventFileLoader
    from tensorboard.compat.proto import event_pb2

    expected: Counter = Counter()
    for path in sorted(out.rglob("*")):
        if not path.is_file():
            continue
        relative = path.relative_to(out)
        if "tfevents" in path.name:
            source = f"tensorboard:{relative.parent.as_posix()}"
            for raw in RawEventFileLoader(str(path)).Load():
                event = event_pb2.Event.FromString(raw)
                for value in event.summary.value:
                    if value.WhichOneof("value") == "simple_value":
                        expected[(source, value.tag, event.step, float(value.simple_value))] += 1
        elif path.name.endswith(".jsonl"):
            source = f"jsonl:{relative.as_posix()}"
            for line in path.read_text().splitlines():
                obj = json.loads(line)
                step = obj.pop("step")
                for key in ("wall_time", "time", "timestamp"):
                    obj.pop(key, None)
                for name, value in obj.items():
                    if isinstance(value, int | float) and not isinstance(value, bool):
                        expected[(source, name, step, float(value))] += 1
    return expected


def stored_points(conn_or_db, job_id: int) -> Counter:
    rows = conn_or_db.execute(
        "SELECT s.source, s.name, p.step, p.value FROM tuneplane.telemetry_points p"
        " JOIN tuneplane.telemetry_series s ON s.id = p.series_id WHERE s.job_id = %s",
        (job_id,),
    ).fetchall()
    return Counter(
        (r[0], r[1], r[2], r[3])
        if not isinstance(r, dict)
        else (r["source"], r["name"], r["step"], r["value"])
        for r in rows
    )


def stored_count(conn, job_id: int) -> int:
    row = conn.execute(
        "SELECT count(*) FROM tuneplane.telemetry_points p JOIN tuneplane.telemetry_series s"
        " ON s.id = p.series_id WHERE s.job_id = %s",
        (job_id,),
    ).fetchone()
    return row[0] if not isinstance(row, dict) else row["count"]


def tcp_connections() -> list[list[str]]:
    """The fields of every line of /proc/net/tcp and tcp6 (no extra tools): [1] local address:port (hex),
    [3] state ("01" established), [4] tx_queue:rx_queue (hex)."""
    rows = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        rows += [line.split() for line in lines]
    return rows


def local_port(fields: list[str]) -> int:
    return int(fields[1].rsplit(":", 1)[1], 16)
