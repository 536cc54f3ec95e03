"""The cost of the hot sweeps does not grow with history (issue 10, item 13).

The worker runs sweep_lost_nodes() every poll interval (1 s). Its cost must depend on the nodes and the
members holding resources now, never on how many members ever ran. This bench builds one fleet of
--nodes nodes (a tenth of them lost, each lost node holding one running member, the others one running
member each too), then adds released historical members in steps (10k, then 300k in all) and times the
sweep in steady state (nothing left to mark: what it costs every second) and a placement pass with one
queued job, at each size. It prints the median time per call and the shared buffers one call touches
(the load-independent measure), each with its ratio to the smallest history.
Run: .venv/bin/python bench/sweep_history.py [--nodes 1000] [--sizes 10000,300000] [--calls 50]
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
INSERT INTO tuneplane.nodes (fleet_id, name, cpus, memory_bytes, address, last_heartbeat_at)
SELECT 1, 'n' || i, 128, 1024::bigint ^ 4, '10.0.' || (i / 250) || '.' || (i % 250 + 1),
       CASE WHEN i % 10 = 0 THEN now() - interval '1 day' ELSE now() + interval '1 day' END
  FROM generate_series(1, {nodes}) i;
INSERT INTO tuneplane.node_gpus (node_id, gpu_index, model, simulated)
SELECT n.id, g, 'Simulated GPU', true FROM tuneplane.nodes n, generate_series(0, 7) g;
INSERT INTO tuneplane.previews (owner_id, fleet_id, spec, resolved, canonical, digest, expires_at)
SELECT 1, 1, '{{}}', jsonb_build_object('i', i), 'p' || i, md5('p' || i) || md5(i || 'p'),
       now() + interval '1 day'
  FROM generate_series(1, {nodes} + 1) i;
-- Job 1 carries the history (many ended attempts); jobs 2.. each run one member on one node now.
INSERT INTO tuneplane.jobs (owner_id, preview_id, fleet_id, state, state_reason, nodes, gpus_per_node,
                            cpus_per_node, memory_per_node, max_attempts, spec)
SELECT 1, p.id, 1, CASE WHEN p.canonical = 'p1' THEN 'failed' ELSE 'running' END, 'bench',
       1, 1, 1, 0, 1, '{{}}'
  FROM tuneplane.previews p ORDER BY p.id;
INSERT INTO tuneplane.attempts (job_id, number, fleet_id, state, master_addr, master_port)
SELECT j.id, 1, 1, 'running', '10.9.9.9', 20000 + j.id FROM tuneplane.jobs j WHERE j.id > 1;
INSERT INTO tuneplane.members (attempt_id, job_id, rank, node_id, gpu_indices, cpus, memory_bytes, state,
                               started_at)
SELECT a.id, a.job_id, 0, a.job_id - 1, '{{0}}', 1, 0, 'running', now() FROM tuneplane.attempts a;
"""

HISTORY = """
WITH a AS (
  INSERT INTO tuneplane.attempts (job_id, number, fleet_id, state, ended_at)
  SELECT 1, n, 1, 'failed', now() FROM generate_series(%(first)s::integer, %(last)s::integer) n
  RETURNING id
)
INSERT INTO tuneplane.members (attempt_id, job_id, rank, node_id, gpu_indices, cpus, memory_bytes, state,
                               started_at, ended_at, released_at, exit_code)
SELECT a.id, 1, 0, 1 + (a.id %% %(nodes)s::integer), '{0}', 1, 0, 'exited', now(), now(), now(), 0 FROM a
"""


def median_ms(conn: psycopg.Connection, statement: str, calls: int) -> float:
    times = []
    for _ in range(calls):
        t0 = time.perf_counter()
        conn.execute(statement).fetchall()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1000


def buffers(conn: psycopg.Connection, statement: str) -> int:
    """Shared buffers one call touches (hit + read): the cost measure that does not depend on machine load."""
    plan = conn.execute(f"EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) {statement}").fetchone()[0][0]["Plan"]
    return int(plan["Shared Hit Blocks"]) + int(plan["Shared Read Blocks"])


def measure(url: str, args: argparse.Namespace) -> None:
    sizes = [int(s) for s in args.sizes.split(",")]
    rows = []
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(SETUP.format(nodes=int(args.nodes)))
        marked = conn.execute("SELECT tuneplane.sweep_lost_nodes()").fetchone()[0]
        done = 0
        for size in sizes:
            conn.execute(HISTORY, {"first": done + 2, "last": size + 1, "nodes": args.nodes})
            done = size
            conn.execute("VACUUM ANALYZE tuneplane.members")
            conn.execute("VACUUM ANALYZE tuneplane.attempts")
            history = conn.execute("SELECT count(*) FROM tuneplane.members").fetchone()[0]
            sweep = median_ms(conn, "SELECT tuneplane.sweep_lost_nodes()", args.calls)
            place = median_ms(conn, "SELECT * FROM tuneplane.reserve_next(1)", args.calls)
            rows.append(
                (
                    history,
                    sweep,
                    buffers(conn, "SELECT tuneplane.sweep_lost_nodes()"),
                    place,
                    buffers(conn, "SELECT * FROM tuneplane.reserve_next(1)"),
                )
            )
    print(f"{args.nodes} nodes (a tenth lost), {marked} members marked contact-lost by the first sweep")
    print("median time per call (load-sensitive) and shared buffers per call (not), with ratios to the first")
    print(
        f"{'members in history':>20} {'sweep_lost_nodes':>16} {'ratio':>6} {'buffers':>8} {'ratio':>6}"
        f" {'reserve_next':>13} {'buffers':>8} {'ratio':>6}"
    )
    base = rows[0]
    for history, sweep, sweep_buf, place, place_buf in rows:
        print(
            f"{history:>20,} {sweep:>13.2f} ms {sweep / base[1]:>6.2f} {sweep_buf:>8}"
            f" {sweep_buf / base[2]:>6.2f} {place:>10.2f} ms {place_buf:>8} {place_buf / base[4]:>6.2f}"
        )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--sizes", default="10000,300000")
    parser.add_argument("--calls", type=int, default=50)
    args = parser.parse_args()
    with migrated_database() as url:
        measure(url, args)


if __name__ == "__main__":
    main()
