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

The machine is shared and noisy, so it runs several rounds (each with its own COPY before and after) and
reports the median ratios; it also prints the CPU seconds each process spent, to show where time goes.

Run: .venv/bin/python bench/telemetry_ingest.py [--points 2000000] [--rounds 3] [--database-url URL]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import psycopg
from telemetry_common import REPO, bench_database, job_with_token

from tests.conftest import free_port
from tests.helpers import wait_for
from tuneplane.app.components import tuneplane_argv
from tuneplane.app.telemetry.ingest import COPY_SQL, copy_buffer
from tuneplane.workers.collector import tfrecord


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


def count(conn: psycopg.Connection, job: int) -> int:
    sql = "SELECT coalesce(sum(point_count), 0) FROM tuneplane.telemetry_series WHERE job_id = %s"
    return int(conn.execute(sql, (job,)).fetchone()[0])


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a live process (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def postgres_cpu_seconds() -> float:
    total = 0.0
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and (entry / "comm").read_text().strip() == "postgres":
                total += cpu_seconds(int(entry.name))
        except OSError:
            continue
    return total


def end_to_end(url: str, out: Path, total: int, tmp: Path) -> tuple[float, float, str]:
    job, token = job_with_token(url, f"bench-{tmp.name}")
    port = free_port()
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    tmp.mkdir(parents=True, exist_ok=True)
    gateway_log = open(tmp / "gateway.log", "wb")  # noqa: SIM115 - closed with the process
    gateway = subprocess.Popen(
        tuneplane_argv("telemetry-gateway", "--database-url", url, "--port", str(port)),
        cwd=REPO,
        env=env,
        stderr=gateway_log,
    )
    collector = None
    try:
        import httpx

        try:
            wait_for(
                lambda: gateway.poll() is not None or _ok(httpx, f"http://127.0.0.1:{port}/healthz"),
                timeout=60,
                what="the telemetry gateway",
            )
        except AssertionError:
            gateway.poll()
        if gateway.returncode is not None or not _ok(httpx, f"http://127.0.0.1:{port}/healthz"):
            tail = (tmp / "gateway.log").read_bytes()[-4000:].decode(errors="replace")
            raise RuntimeError(f"the telemetry gateway did not come up (exit {gateway.returncode}):\n{tail}")
        conn = psycopg.connect(url, autocommit=True)
        pg_before, gateway_before = postgres_cpu_seconds(), cpu_seconds(gateway.pid)
        started = time.perf_counter()
        collector = subprocess.Popen(
            [
                sys.executable,
                "-P",
                "-m",
                "tuneplane",
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
        first = wait_for(lambda: count(conn, job) > 0 and time.perf_counter(), timeout=120, interval=0.01)
        first_count = count(conn, job)
        wait_for(lambda: count(conn, job) >= total, timeout=600, interval=0.02, what="all points")
        done = time.perf_counter()
        cpu = (
            f"CPU seconds: collector {cpu_seconds(collector.pid):.2f}, gateway "
            f"{cpu_seconds(gateway.pid) - gateway_before:.2f}, "
            f"PostgreSQL {postgres_cpu_seconds() - pg_before:.2f} "
            f"(wall {done - started:.2f} s, first batch stored after {first - started:.2f} s)"
        )
        stored = conn.execute("SELECT count(*) FROM tuneplane.telemetry_points").fetchone()[0]
        assert stored == total, (stored, total)
        conn.close()
        return total / (done - started), (total - first_count) / (done - first), cpu
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
    parser.add_argument("--rounds", type=int, default=3)
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
        # On disk before the clock starts, as a training job's files are: the write-back of 60 MB must not
        # land in the first round.
        os.sync()
        print(
            f"wrote {jsonl_points:,} JSONL points and {tb_points:,} TensorBoard points in "
            f"{time.perf_counter() - t0:.1f}s"
        )
        from_start: list[float] = []
        steady_state: list[float] = []
        for round_no in range(1, args.rounds + 1):
            before = baseline_copy(url, total)
            whole, steady, cpu = end_to_end(url, tmp / "out", total, tmp / f"round-{round_no}")
            after = baseline_copy(url, total)
            copy_rate = (before + after) / 2
            from_start.append(whole / copy_rate)
            steady_state.append(steady / copy_rate)
            print(
                f"round {round_no}: binary COPY {copy_rate:,.0f} points/s (before {before:,.0f}, after "
                f"{after:,.0f}); collector → gateway → database {whole:,.0f} points/s from collector start, "
                f"{steady:,.0f} from first stored batch to last: ratios {from_start[-1]:.2f}, "
                f"{steady_state[-1]:.2f} (load average {os.getloadavg()[0]:.1f})"
            )
            print(f"  {cpu}")
        print(
            f"ratio to binary COPY, median of {args.rounds} rounds: {statistics.median(from_start):.2f} "
            f"(from start), {statistics.median(steady_state):.2f} (steady); target ≥ 0.6"
        )


if __name__ == "__main__":
    main()
