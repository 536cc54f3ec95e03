"""Telemetry ingest: points/s from files through collector → gateway → PostgreSQL, next to a binary COPY of
the same points into the same indexed table in the same run. Target: ratio ≥ 0.6.

Writes a JSONL file (4 metrics a line) and a TensorBoard event file, starts a real `tuneplane
telemetry-gateway` and a real `tuneplane collector` (durable spool, fsync about every second) and times
until every point is in telemetry_points (series, ledger and rollups maintained as in production). The
baseline COPYs the same rows, already encoded in PostgreSQL's binary COPY format, in one statement into
the same (emptied) telemetry_points table with its (series_id, step) index, once before and once after
the end-to-end run (their mean is the baseline, so load that changes during the run weighs on both
sides alike). Prints the rates and, in the same run, the ratio from the collector's start (start-up, the
first read and the first fsync included) next to the steady-state ratio (first stored batch to last).

Run: .venv/bin/python bench/telemetry_ingest.py [--points 2000000] [--database-url URL]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import psycopg
from telemetry_common import REPO, bench_database, job_with_token

from app.telemetry.ingest import COPY_SQL, copy_buffer
from tests.conftest import free_port
from tests.helpers import wait_for
from workers.collector import tfrecord


def write_files(out: Path, jsonl_points: int, tb_points: int) -> None:
    from tensorboardX.proto import event_pb2, summary_pb2

    out.mkdir(parents=True)
    lines = jsonl_points // 4
    with open(out / "metrics.jsonl", "w") as handle:
        for step in range(lines):
            handle.write(
                json.dumps(
                    {
                        "step": step,
                        "loss": 1.0 / (step + 1),
                        "lr": 1e-4,
                        "grad_norm": step % 7,
                        "throughput": 1000.0 + step % 13,
                    }
                )
                + "\n"
            )
    (out / "tb").mkdir()
    frames = [
        tfrecord.frame(event_pb2.Event(wall_time=1.0, file_version="brain.Event:2").SerializeToString())
    ]
    for step in range(tb_points):
        event = event_pb2.Event(wall_time=1000.0 + step, step=step)
        event.summary.value.append(summary_pb2.Summary.Value(tag="eval/loss", simple_value=step * 0.5))
        frames.append(tfrecord.frame(event.SerializeToString()))
    (out / "tb" / "events.out.tfevents.1.bench").write_bytes(b"".join(frames))


def count(conn: psycopg.Connection) -> int:
    return int(
        conn.execute("SELECT coalesce(sum(point_count), 0) FROM tuneplane.telemetry_series").fetchone()[0]
    )


def end_to_end(url: str, out: Path, total: int, tmp: Path) -> tuple[float, float]:
    _job, token = job_with_token(url)
    port = free_port()
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    gateway_log = open(tmp / "gateway.log", "wb")  # noqa: SIM115 - closed with the process
    gateway = subprocess.Popen(
        [sys.executable, "-m", "app", "telemetry-gateway", "--database-url", url, "--port", str(port)],
        cwd=REPO,
        env=env,
        stderr=gateway_log,
    )
    collector = None
    try:
        import httpx

        wait_for(
            lambda: gateway.poll() is None and _ok(httpx, f"http://127.0.0.1:{port}/healthz"),
            timeout=60,
            what=f"gateway (log: {tmp / 'gateway.log'})",
        )
        conn = psycopg.connect(url, autocommit=True)
        started = time.perf_counter()
        collector = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "app",
                "collector",
                "--output-dir",
                str(out),
                "--spool-dir",
                str(tmp / "spool"),
                "--gateway",
                f"http://127.0.0.1:{port}",
                "--token",
                token,
            ],
            cwd=REPO,
            env=env,
            stderr=subprocess.DEVNULL,
        )
        first = wait_for(lambda: count(conn) > 0 and time.perf_counter(), timeout=120, interval=0.01)
        first_count = count(conn)
        wait_for(lambda: count(conn) >= total, timeout=600, interval=0.02, what="all points")
        done = time.perf_counter()
        import os as _os
        def _cpu(pid):
            f = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
            return (int(f[11]) + int(f[12])) / _os.sysconf("SC_CLK_TCK")
        pg = 0.0
        for d in _os.listdir("/proc"):
            if d.isdigit():
                try:
                    if open(f"/proc/{d}/comm").read().strip() == "postgres":
                        pg += _cpu(d)
                except OSError:
                    pass
        print(f"CPU s: collector {_cpu(collector.pid):.2f} gateway {_cpu(gateway.pid):.2f} postgres(all live) {pg:.2f}; wall {done-started:.2f} first {first-started:.2f}")
        stored = conn.execute("SELECT count(*) FROM tuneplane.telemetry_points").fetchone()[0]
        assert stored == total, (stored, total)
        conn.close()
        return total / (done - started), (total - first_count) / (done - first)
    finally:
        for process in (collector, gateway):
            if process is not None and process.poll() is None:
                process.send_signal(signal.SIGTERM)
                process.wait(60)


def _ok(httpx, url: str) -> bool:
    try:
        return httpx.get(url, timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


def baseline_copy(url: str, total: int) -> float:
    rng = np.random.default_rng(1)
    series = np.repeat(np.arange(1_000_001, 1_000_006, dtype=np.int64), total // 5 + 1)[:total]
    steps = np.tile(np.arange(total // 5 + 1, dtype=np.int64), 5)[:total]
    buffer = copy_buffer(series, steps, rng.normal(size=total), np.full(total, 1000.0))
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("TRUNCATE tuneplane.telemetry_points")
        conn.execute("CHECKPOINT")
        started = time.perf_counter()
        with conn.transaction(), conn.cursor().copy(COPY_SQL) as copy:
            copy.write(buffer)
        elapsed = time.perf_counter() - started
        conn.execute("TRUNCATE tuneplane.telemetry_points")
    return total / elapsed


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--points", type=int, default=2_000_000)
    parser.add_argument("--database-url", default=None)
    args = parser.parse_args()
    jsonl_points = (args.points * 3 // 4) // 4 * 4
    tb_points = args.points - jsonl_points
    total = jsonl_points + tb_points
    with (
        tempfile.TemporaryDirectory(prefix="tp-bench-ingest-") as tmp_name,
        bench_database(args.database_url) as url,
    ):
        tmp = Path(tmp_name)
        t0 = time.perf_counter()
        write_files(tmp / "out", jsonl_points, tb_points)
        print(
            f"wrote {jsonl_points:,} JSONL points and {tb_points:,} TensorBoard points in "
            f"{time.perf_counter() - t0:.1f}s"
        )
        before = baseline_copy(url, total)
        whole, steady = end_to_end(url, tmp / "out", total, tmp)
        after = baseline_copy(url, total)
        copy_rate = (before + after) / 2
        print(
            f"binary COPY into indexed telemetry_points: {copy_rate:,.0f} points/s "
            f"(before {before:,.0f}, after {after:,.0f}; load average {os.getloadavg()[0]:.1f})"
        )
        print(
            f"collector → gateway → database: {whole:,.0f} points/s from collector start "
            f"({steady:,.0f} points/s from first stored batch to last)"
        )
        print(
            f"ratio to binary COPY: {whole / copy_rate:.2f} (from start), {steady / copy_rate:.2f} (steady); "
            f"target ≥ 0.6"
        )


if __name__ == "__main__":
    main()
