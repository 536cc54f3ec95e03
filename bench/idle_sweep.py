"""The idle-GPU sweep's cost per job does not grow with the number of running jobs (issue 22).

sweep_idle_jobs() judges each running job from its stored GPU samples over the policy's window (30 min):
a bounded query per job, over the samples' rollup cells (docs/idle.md). This bench builds running jobs of
--gpus GPUs each, whose
collectors stored 31 minutes of samples every 10 s (utilization and power per GPU, and the board's power
limit: what workers/collector/system.py writes), first 100 jobs, then 10,000, and times the sweep in steady
state (every job already warned, still idle: what a sweep costs each minute) evaluating --batch jobs per
call. It prints the median time per job evaluated and the shared buffers one job costs (the
load-independent measure) at each size, with the ratio of the largest size to the smallest, and the time
one full pass over every running job takes.
Run under the bench lock: flock /work/bench.lock .venv/bin/python bench/idle_sweep.py
    [--sizes 100,10000] [--gpus 2] [--batch 100] [--calls 20]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import psycopg
from embedded_db import migrated_database

SETUP = """
INSERT INTO tuneplane.users (username, role) VALUES ('bench', 'user');
INSERT INTO tuneplane.fleets (name, backend) VALUES ('bench', 'node');
UPDATE tuneplane.idle_settings SET check_every = interval '0';
"""

# Jobs %(first)s..%(last)s: one node each, one running member holding GPUs 0..gpus-1, its samples and their
# rollup cells (as the telemetry gateway stores them), and its watch row (as the trigger jobs_idle_watch
# makes it when a job becomes running; these rows are inserted running).
JOBS = """
INSERT INTO tuneplane.nodes (fleet_id, name, cpus, memory_bytes, address, last_heartbeat_at)
SELECT 1, 'n' || i, 128, 1024::bigint ^ 4,
       '10.' || (i / 62500) || '.' || mod(i / 250, 250) || '.' || (mod(i, 250) + 1),
       now() + interval '1 day'
  FROM generate_series(%(first)s::integer, %(last)s::integer) i;
INSERT INTO tuneplane.previews (owner_id, fleet_id, spec, resolved, canonical, digest, expires_at)
SELECT 1, 1, '{}', jsonb_build_object('i', i), 'p' || i, md5('p' || i) || md5(i || 'p'),
       now() + interval '1 day'
  FROM generate_series(%(first)s::integer, %(last)s::integer) i;
INSERT INTO tuneplane.jobs (owner_id, preview_id, fleet_id, state, state_reason, nodes, gpus_per_node,
                            cpus_per_node, memory_per_node, max_attempts, spec)
SELECT 1, p.id, 1, 'running', 'bench', 1, %(gpus)s::integer, 1, 0, 1, '{}'
  FROM tuneplane.previews p
 WHERE p.canonical IN (SELECT 'p' || i FROM generate_series(%(first)s::integer, %(last)s::integer) i)
 ORDER BY p.id;
INSERT INTO tuneplane.attempts (job_id, number, fleet_id, state, master_addr, master_port)
SELECT j.id, 1, 1, 'running', '10.9.' || (j.id / 60000) || '.9', 1024 + mod(j.id, 60000) FROM tuneplane.jobs j
 WHERE NOT EXISTS (SELECT 1 FROM tuneplane.attempts a WHERE a.job_id = j.id);
INSERT INTO tuneplane.members (attempt_id, job_id, rank, node_id, gpu_indices, cpus, memory_bytes, state,
                               started_at)
SELECT a.id, a.job_id, 0, (SELECT n.id FROM tuneplane.nodes n WHERE n.name = 'n' || a.job_id),
       (SELECT array_agg(g) FROM generate_series(0, %(gpus)s::integer - 1) g), 1, 0, 'running', now()
  FROM tuneplane.attempts a WHERE NOT EXISTS (SELECT 1 FROM tuneplane.members m WHERE m.attempt_id = a.id);
INSERT INTO tuneplane.telemetry_series (job_id, attempt, member_rank, source, name, point_count, last_value)
SELECT j.id, 1, 0, 'system', format('system/gpu.%%s.%%s', g, what), 0, 700
  FROM tuneplane.jobs j, generate_series(0, %(gpus)s::integer - 1) g,
       unnest(ARRAY['utilization', 'power_watts', 'power_limit_watts']) what
 WHERE j.id BETWEEN %(first)s AND %(last)s;
INSERT INTO tuneplane.telemetry_points (series_id, step, value, wall_time)
SELECT s.id, %(t0_ms)s::bigint - k * 10000, CASE WHEN s.name LIKE '%%utilization' THEN 0 ELSE 70 END,
       (%(t0_ms)s::bigint - k * 10000) / 1000.0
  FROM tuneplane.telemetry_series s, generate_series(0, 186) k
 WHERE s.job_id BETWEEN %(first)s AND %(last)s AND s.name NOT LIKE '%%limit%%';
INSERT INTO tuneplane.telemetry_rollups (series_id, width, bucket, n, sum, min, max, first_step, last_step,
                                         last_value, last_wall)
SELECT t.series_id, 32768, t.step / 32768, count(*), sum(t.value), min(t.value), max(t.value), min(t.step),
       max(t.step), (array_agg(t.value ORDER BY t.step DESC))[1], max(t.wall_time)
  FROM tuneplane.telemetry_points t JOIN tuneplane.telemetry_series s ON s.id = t.series_id
 WHERE s.job_id BETWEEN %(first)s AND %(last)s
 GROUP BY t.series_id, t.step / 32768;
INSERT INTO tuneplane.job_idle (job_id, watching)
SELECT j.id, true FROM tuneplane.jobs j WHERE j.id BETWEEN %(first)s AND %(last)s;
"""

SWEEP = "SELECT * FROM tuneplane.sweep_idle_jobs(%(batch)s, to_timestamp(%(t0_ms)s / 1000.0))"


def median_ms(conn: psycopg.Connection, params: dict, calls: int) -> float:
    times = []
    for _ in range(calls):
        t0 = time.perf_counter()
        conn.execute(SWEEP, params).fetchall()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1000


def buffers(conn: psycopg.Connection, params: dict) -> int:
    """Shared buffers one sweep call touches (hit + read), the statements of the functions it calls included
    (EXPLAIN counts a function scan's buffers with everything run inside it)."""
    plan = conn.execute(f"EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) {SWEEP}", params).fetchone()[0][0]["Plan"]
    return int(plan["Shared Hit Blocks"]) + int(plan["Shared Read Blocks"])


def measure(url: str, args: argparse.Namespace) -> None:
    sizes = [int(s) for s in args.sizes.split(",")]
    t0_ms = int(time.time() * 1000)
    params = {"batch": args.batch, "t0_ms": t0_ms}
    rows = []
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(SETUP)
        done = 0
        for size in sizes:
            started = time.perf_counter()
            for statement in JOBS.split(";\n")[:-1]:
                conn.execute(statement, {"first": done + 1, "last": size, "gpus": args.gpus, "t0_ms": t0_ms})
            done = size
            tables = ("jobs", "attempts", "members", "telemetry_series", "telemetry_rollups", "job_idle")
            for table in tables:
                conn.execute(f"VACUUM ANALYZE tuneplane.{table}")
            built = time.perf_counter() - started
            # One full pass: every job is warned (its reason and an event written): the first minute's cost.
            pass_started = time.perf_counter()
            unchecked = (
                "SELECT EXISTS (SELECT 1 FROM tuneplane.job_idle WHERE watching AND checked_at IS NULL)"
            )
            while conn.execute(unchecked).fetchone()[0]:
                conn.execute(
                    "SELECT * FROM tuneplane.sweep_idle_jobs(500, to_timestamp(%(t0_ms)s / 1000.0))",
                    {"t0_ms": t0_ms},
                ).fetchall()
            first_pass = time.perf_counter() - pass_started
            warned = conn.execute(
                "SELECT count(*) FROM tuneplane.job_idle WHERE warned_at IS NOT NULL"
            ).fetchone()[0]
            conn.execute("VACUUM ANALYZE tuneplane.job_idle")
            steady = median_ms(conn, params, args.calls)
            per_job_buffers = buffers(conn, params) / args.batch
            rows.append((size, steady / args.batch, per_job_buffers, first_pass, warned, built))
    print(
        f"running jobs of {args.gpus} GPU(s), 31 min of samples every 10 s each; steady state: every job"
        " warned"
        f" and still idle; {args.batch} jobs evaluated per call, median of {args.calls} calls"
    )
    print(
        f"{'running jobs':>12} {'per job':>10} {'ratio':>6} {'buffers/job':>12} {'ratio':>6}"
        f" {'first full pass':>16} {'warned':>7} {'built in':>9}"
    )
    base = rows[0]
    for size, per_job, buf, first_pass, warned, built in rows:
        print(
            f"{size:>12,} {per_job:>7.3f} ms {per_job / base[1]:>6.2f} {buf:>12.1f} {buf / base[2]:>6.2f}"
            f" {first_pass:>14.2f} s {warned:>7,} {built:>7.1f} s"
        )
    last = rows[-1]
    print(
        f"ratio of the cost per job at {last[0]:,} running jobs to {base[0]:,}: "
        f"{last[1] / base[1]:.2f} (time), "
        f"{last[2] / base[2]:.2f} (buffers)"
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", default="100,10000")
    parser.add_argument("--gpus", type=int, default=2)
    parser.add_argument("--batch", type=int, default=100)
    parser.add_argument("--calls", type=int, default=20)
    args = parser.parse_args()
    with migrated_database("bench_idle") as url:
        measure(url, args)


if __name__ == "__main__":
    main()
