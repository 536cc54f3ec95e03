"""Time from confirmation to every member running, on an idle local fleet (targets: p50 < 0.5 s, p99 < 2 s).

The script starts its own installation in a temporary directory: an embedded PostgreSQL, then
`tuneplane up --database-url …` (console server, node gateway, the one local agent, telemetry gateway and
the node backend worker), exactly the processes a user gets. Each run previews and confirms a 1-member
`demo` job over HTTP with the admin token `up` wrote, waits until the attempt is running, then until the
job has finished, so the next run finds the fleet idle again. The first --warmup runs (cold: the runtime
environment is prepared once per node) are not counted.

The latency is measured in the database, with the database's clock on both ends:
  attempts.running_at (all members running, set by member_started) − jobs.created_at (the confirmation's
  transaction). The breakdown shows where the time goes: confirmation → reserved (placement), reserved →
  committed (worker claim + capsule + PREPARE + agents prepared), committed → running (START + runner).

Run: .venv/bin/python bench/launch_latency.py [--runs 30] [--warmup 2] [--timeout 120] [--keep]
     [--backend slurm] (bench/launch_slurm.py: against raw Slurm, in interleaved pairs)
     [--nodes N] (bench/launch_nodes.py: N local agents, 1-member and N-member jobs in alternation)
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import httpx
import psycopg
from psycopg.rows import dict_row

from tests.e2e.up_process import free_port_run
from tuneplane.app import embedded_pg
from tuneplane.app.client.config import read_config_file

REPO = Path(__file__).resolve().parents[1]
TARGET_P50 = 0.5
TARGET_P99 = 2.0
TERMINAL = ("succeeded", "failed", "cancelled")
JOB = {
    "recipe": {"name": "demo", "params": {"steps": 1, "step_seconds": 0}},
    "resources": {"gpus_per_node": 0, "cpus_per_node": 1, "memory_per_node": 256 * 1024**2},
}

TIMES = """
SELECT j.state, j.state_reason, j.created_at, a.created_at AS reserved_at, a.committed_at, a.running_at,
       a.state AS attempt_state, p.sent_at AS prepare_sent_at, p.delivered_at AS prepare_delivered_at
  FROM tuneplane.jobs j
  LEFT JOIN tuneplane.attempts a ON a.job_id = j.id AND a.number = 1
  LEFT JOIN LATERAL (SELECT max(c.created_at) AS sent_at, max(c.delivered_at) AS delivered_at
                       FROM tuneplane.node_commands c
                      WHERE c.kind = 'prepare' AND (c.payload ->> 'attempt_id')::bigint = a.id) p ON true
 WHERE j.id = %s
"""
# (label, from column, to column) of the breakdown.
PHASES = [
    ("place", "created_at", "reserved_at"),  # placement pass after the confirmation's NOTIFY
    ("worker", "reserved_at", "prepare_sent_at"),  # pgqueuer pick-up, claim, capsule, begin_prepare
    ("deliver", "prepare_sent_at", "prepare_delivered_at"),  # node gateway outbox → agent
    ("prepare", "prepare_delivered_at", "committed_at"),  # agent prepares, member_prepared → COMMIT
    ("start", "committed_at", "running_at"),  # START delivered, runner started, member_started
]


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    if len(ordered) == 1:
        return ordered[0]
    rank = q * (len(ordered) - 1)
    low = int(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def poll(check, timeout: float, interval: float = 0.01):
    """Bounded poll: the value once `check` returns something truthy, else None after `timeout`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(interval)
    return None


class Installation:
    """Embedded PostgreSQL + `tuneplane up` in a temporary directory."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.pg = embedded_pg.start(root / "pg")
        self.url = self.pg.url
        self.port = free_port_run()
        self.env = {**os.environ, "TUNEPLANE_CONFIG": str(root / "config.toml"), "PYTHONUNBUFFERED": "1"}
        for name in ("TUNEPLANE_DATABASE_URL", "TUNEPLANE_SERVER", "TUNEPLANE_TOKEN", "TUNEPLANE_DATA_DIR"):
            self.env.pop(name, None)
        self.output = open(root / "up.log", "wb")  # noqa: SIM115 - closed in stop()
        self.up = subprocess.Popen(
            [
                sys.executable,
                "-P",
                "-m",
                "tuneplane",
                "up",
                "--database-url",
                self.url,
                "--data-dir",
                str(root / "data"),
                "--port",
                str(self.port),
            ],
            cwd=REPO,
            env=self.env,
            stdout=self.output,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def wait_up(self, timeout: float) -> None:
        log = self.root / "up.log"
        if not poll(
            lambda: b"TunePlane is up:" in log.read_bytes() or self.up.poll() is not None, timeout, 0.2
        ):
            raise SystemExit(f"tuneplane up did not come up in {timeout:.0f}s; see {log}")
        if self.up.poll() is not None:
            raise SystemExit(f"tuneplane up exited with status {self.up.returncode}:\n{self.tail()}")

    def tail(self, lines: int = 40) -> str:
        parts = [(self.root / "up.log").read_text(errors="replace").splitlines()[-lines:]]
        for path in sorted((self.root / "data").rglob("*.log")):
            parts.append([f"--- {path.relative_to(self.root)}"])
            parts.append(path.read_text(errors="replace").splitlines()[-lines:])
        return "\n".join(line for part in parts for line in part)

    def stop(self) -> None:
        if self.up.poll() is None:
            os.killpg(self.up.pid, signal.SIGTERM)
            try:
                self.up.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(self.up.pid, signal.SIGKILL)
                self.up.wait(10)
        self.output.close()
        self.pg.stop()


def submit(client: httpx.Client, key: str, job: dict = JOB) -> int:
    preview = client.post("/previews", json=job)
    preview.raise_for_status()
    body = preview.json()
    receipt = client.post(
        f"/previews/{body['id']}/confirm", json={"digest": body["digest"], "retry_key": key}
    )
    receipt.raise_for_status()
    return receipt.json()["job_id"]


def one_run(client: httpx.Client, conn: psycopg.Connection, key: str, timeout: float) -> dict:
    job_id = submit(client, key)

    def row() -> dict:
        return conn.execute(TIMES, (job_id,)).fetchone()

    running = poll(lambda: (r := row())["running_at"] is not None or r["state"] in TERMINAL, timeout)
    current = row()
    if not running or current["running_at"] is None:
        return {"job_id": job_id, "ok": False, "state": current["state"], "reason": current["state_reason"]}
    finished = poll(lambda: row()["state"] in TERMINAL, timeout, 0.05)
    end = row()
    if not finished:
        # Leave the fleet idle for the next run whatever happened to this one.
        client.post(f"/jobs/{job_id}/cancel", json={"reason": "launch benchmark: run did not finish"})
        poll(lambda: row()["state"] in TERMINAL, timeout, 0.05)
    result = {
        "job_id": job_id,
        "ok": True,
        "latency": (current["running_at"] - current["created_at"]).total_seconds(),
        "final": end["state"],
    }
    for label, start, stop in PHASES:
        result[label] = (current[stop] - current[start]).total_seconds()
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--timeout", type=float, default=120.0, help="Seconds one run may take to start.")
    parser.add_argument("--keep", action="store_true", help="Keep the temporary directory (logs).")
    parser.add_argument(
        "--backend",
        choices=("node", "slurm"),
        default="node",
        help="slurm: TunePlane against raw sbatch … srun on a private 2-node Slurm cluster, in pairs.",
    )
    parser.add_argument(
        "--nodes",
        type=int,
        default=0,
        help="N agents on this machine: 1-member and N-member jobs in alternation (bench/launch_nodes.py).",
    )
    parser.add_argument(
        "--trace",
        action="store_true",
        help="With --nodes: each run's member timeline and CPU by process; with --backend slurm: the "
        "attempt's files.",
    )
    args = parser.parse_args()
    if args.backend == "slurm":
        from launch_slurm import main as slurm_main

        return slurm_main(args)

    root = Path(tempfile.mkdtemp(prefix="tp-launch-bench-"))
    print(f"installation in {root}", flush=True)
    inst = Installation(root)
    failed = False
    try:
        inst.wait_up(180)
        config = read_config_file(root / "config.toml")
        with (
            psycopg.connect(inst.url, autocommit=True, row_factory=dict_row) as conn,
            httpx.Client(
                base_url=config["server"],
                headers={"Authorization": f"Bearer {config['token']}", "Accept": "application/json"},
                timeout=30,
            ) as client,
        ):
            ready = poll(
                lambda: conn.execute(
                    "SELECT count(*) AS n FROM tuneplane.nodes n JOIN tuneplane.fleets f ON f.id = n.fleet_id"
                    " WHERE f.name = 'local' AND n.cpus > 0"
                ).fetchone()["n"],
                120,
                0.2,
            )
            if not ready:
                raise SystemExit(f"the local node never reported its capacity:\n{inst.tail()}")
            if args.nodes > 1:
                from launch_nodes import run as run_nodes

                failed = not run_nodes(args, inst, conn, client)
                return 1 if failed else 0
            results = []
            for i in range(args.warmup + args.runs):
                result = one_run(client, conn, f"bench-{i}", args.timeout)
                label = "warmup" if i < args.warmup else f"run {i - args.warmup + 1:>3}"
                if not result["ok"]:
                    print(
                        f"{label}: job {result['job_id']} never ran: {result['state']}: {result['reason']}",
                        flush=True,
                    )
                    print("the launch path is not working yet; component logs:\n" + inst.tail(), flush=True)
                    failed = True
                    break
                phases = ", ".join(f"{name} {result[name] * 1000:.1f}" for name, _a, _b in PHASES)
                print(
                    f"{label}: job {result['job_id']} running after {result['latency'] * 1000:7.1f} ms "
                    f"({phases}); ended {result['final']}",
                    flush=True,
                )
                if i >= args.warmup:
                    results.append(result)
        if results:
            latencies = [r["latency"] for r in results]
            p50, p99 = percentile(latencies, 0.50), percentile(latencies, 0.99)
            print(f"\nconfirmation → every member running, {len(results)} runs on an idle local fleet:")
            for part, _a, _b in PHASES:
                values = [r[part] for r in results]
                print(
                    f"  {part:<8} median {statistics.median(values) * 1000:8.1f} ms"
                    f"   max {max(values) * 1000:8.1f} ms"
                )
            print(f"  p50 {p50:.3f} s  (target {TARGET_P50} s: {p50 / TARGET_P50:.2f}× the target)")
            print(f"  p99 {p99:.3f} s  (target {TARGET_P99} s: {p99 / TARGET_P99:.2f}× the target)")
            print(f"  max {max(latencies):.3f} s, min {min(latencies):.3f} s")
    finally:
        inst.stop()
        if args.keep or failed:
            print(f"kept {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
