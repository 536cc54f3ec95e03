"""Placements per second in SQL with 1,000 simulated nodes in one fleet (target: 1,000/s or more).

Three measurements in the same run, on an embedded PostgreSQL:
  batch  - 4,000 queued jobs (mostly 1 node, some 2; 1, 2 or 4 GPUs), reserve_next passes placing at most
           --pass-size jobs each until the fleet is full (the real stored function);
  bare   - the floor: the same allocation rows the batch wrote (attempts, members, gpu_allocations), copied
           with plain INSERT … SELECT into tables of the same shape and indexes (no triggers, no foreign
           keys, no search, no job events, no queue), in transactions of --pass-size placements; the ratio
           batch/bare says what the placement logic costs on top of writing its rows;
  single - one job queued at a time, one reserve_next call per job (the latency-bound path);
  teams  - the batch again on a fleet of the same shape shared by --teams teams with quotas (guarantees,
           limits, weights; docs/teams.md) and a mixed queue (every team, half of the jobs preemptible):
           admission by guarantee and weighted fair share; its ratio to the batch without quotas is printed
           (target 0.7 or more).
Run: .venv/bin/python bench/placement_rate.py [--nodes 1000] [--jobs 4000] [--pass-size 250] [--teams 50]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import psycopg
from embedded_db import migrated_database

TARGET = 1000.0
TEAMS_RATIO_TARGET = 0.7

# Three fleets of the same shape: 1 for the batch measurement, 2 for the single one, 3 for the batch with team
# quotas (so none needs a reset that would bypass the lifecycle functions).
SETUP = """
INSERT INTO tuneplane.users (username, role) VALUES ('bench', 'user');
INSERT INTO tuneplane.fleets (name, backend) VALUES ('bench', 'node'), ('single', 'node'), ('teams', 'node');
INSERT INTO tuneplane.nodes (fleet_id, name, cpus, memory_bytes, address, last_heartbeat_at)
SELECT f, 'n' || i, 128, 1024::bigint ^ 4, '10.' || f || '.' || (i / 250) || '.' || (i % 250 + 1),
       now() + interval '1 hour'
  FROM generate_series(1, {nodes}) i, generate_series(1, 3) f;
INSERT INTO tuneplane.node_gpus (node_id, gpu_index, model, simulated)
SELECT n.id, g, 'Simulated GPU', true FROM tuneplane.nodes n, generate_series(0, 7) g;
"""

JOBS = """
WITH p AS (
  INSERT INTO tuneplane.previews (owner_id, fleet_id, spec, resolved, canonical, digest, expires_at)
  SELECT 1, {fleet}, '{{}}', jsonb_build_object('i', i, 'tag', t.tag), t.tag || i,
         md5(t.tag || i) || md5(i || t.tag), now() + interval '1 hour'
    FROM generate_series(1, {jobs}) i, (SELECT %(tag)s::text AS tag) t
  RETURNING id
)
INSERT INTO tuneplane.jobs (owner_id, preview_id, fleet_id, state_reason, nodes, gpus_per_node,
                            cpus_per_node, memory_per_node, max_attempts, spec)
SELECT 1, p.id, {fleet}, 'queued', {nodes_expr}, {gpus_expr}, 1, 0, 1, '{{}}' FROM p;
"""
MIXED = {
    "fleet": 1,
    "nodes_expr": "CASE WHEN random() < 0.1 THEN 2 ELSE 1 END",
    "gpus_expr": "(ARRAY[1, 2, 4])[1 + floor(random() * 3)]",
}
SINGLE = {"fleet": 2, "nodes_expr": "1", "gpus_expr": "1"}
# Fleet 3: --teams teams, each guaranteed an equal part of half the fleet's GPUs, limited to three times
# that, weights 1-3; the same mixed queue spread over the teams, half of it preemptible (may borrow).
TEAMS = """
INSERT INTO tuneplane.teams (name) SELECT 'team' || t FROM generate_series(1, {teams}) t;
INSERT INTO tuneplane.team_quotas (team_id, fleet_id, guaranteed_gpus, limit_gpus, weight)
SELECT t.id, 3, {nodes} * 4 / {teams}, 3 * ({nodes} * 4 / {teams}), 1 + t.id % 3
  FROM tuneplane.teams t WHERE t.personal_of IS NULL;
"""
TEAM_JOBS = """
UPDATE tuneplane.jobs j SET team_id = (SELECT t.id FROM tuneplane.teams t WHERE t.personal_of IS NULL
                                        ORDER BY t.id OFFSET (j.id * 7919) % {teams} LIMIT 1),
                            preemptible = j.id % 2 = 0
 WHERE j.fleet_id = 3;
"""
BARE_TABLES = ("attempts", "members", "gpu_allocations")
BARE_INSERT = {
    "attempts": "INSERT INTO bare_attempts SELECT * FROM tuneplane.attempts WHERE id = ANY(%(ids)s)",
    "members": "INSERT INTO bare_members SELECT * FROM tuneplane.members WHERE attempt_id = ANY(%(ids)s)",
    "gpu_allocations": "INSERT INTO bare_gpu_allocations SELECT g.* FROM tuneplane.gpu_allocations g"
    " JOIN tuneplane.members m ON m.id = g.member_id WHERE m.attempt_id = ANY(%(ids)s)",
}
OVER_LIMIT = """SELECT count(*) FROM (SELECT j.team_id FROM tuneplane.members m
                 JOIN tuneplane.jobs j ON j.id = m.job_id
                 JOIN tuneplane.team_quotas q ON q.team_id = j.team_id AND q.fleet_id = j.fleet_id
                WHERE m.released_at IS NULL GROUP BY j.team_id, q.limit_gpus
               HAVING sum(cardinality(m.gpu_indices)) > q.limit_gpus) o"""
DOUBLE = """SELECT count(*) FROM (SELECT node_id, gpu_index FROM tuneplane.gpu_allocations
                                 WHERE released_at IS NULL GROUP BY 1, 2 HAVING count(*) > 1) d"""


def backend_cpu(conn: psycopg.Connection) -> float:
    """CPU seconds the connection's backend process has used (Linux /proc; the server runs on this host).
    Wall time on a shared machine mostly measures the neighbours; CPU time measures the work."""
    pid = conn.execute("SELECT pg_backend_pid()").fetchone()[0]
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def bare_inserts(conn: psycopg.Connection, pass_sizes: list[int]) -> tuple[float, float]:
    """Seconds (wall, backend CPU) to INSERT the placements' rows again into look-alike tables, one
    transaction per pass."""
    for table in BARE_TABLES:
        conn.execute(
            f"CREATE TEMP TABLE bare_{table} (LIKE tuneplane.{table} INCLUDING DEFAULTS INCLUDING INDEXES)"
        )
    attempts = [r[0] for r in conn.execute("SELECT id FROM tuneplane.attempts ORDER BY id").fetchall()]
    took = 0.0
    start = 0
    cpu0 = backend_cpu(conn)
    for size in pass_sizes:
        ids = attempts[start : start + size]
        start += size
        t0 = time.perf_counter()
        with conn.transaction():
            for table in BARE_TABLES:
                conn.execute(BARE_INSERT[table], {"ids": ids})
        took += time.perf_counter() - t0
    return took, backend_cpu(conn) - cpu0


def alternating(
    conn: psycopg.Connection, fleets: tuple[int, ...], pass_size: int
) -> dict[int, tuple[list[tuple[int, float]], float]]:
    """reserve_next passes over the fleets in turn (one pass of each, again), each fleet until two of its
    passes in a row place nothing: {fleet: ([(placed, seconds)], backend CPU seconds)}. Taking turns gives
    every fleet the same neighbours' load, the same table sizes and the same cached plans, so the ratio of
    two fleets' rates compares their placement logic, not the moment or the order they were measured in."""
    passes: dict[int, list[tuple[int, float]]] = {f: [] for f in fleets}
    cpu = dict.fromkeys(fleets, 0.0)
    done: set[int] = set()
    while len(done) < len(fleets):
        for fleet in fleets:
            if fleet in done:
                continue
            cpu0 = backend_cpu(conn)
            t0 = time.perf_counter()
            n = conn.execute(
                "SELECT count(*) FROM tuneplane.reserve_next(%s, %s)", (fleet, pass_size)
            ).fetchone()[0]
            passes[fleet].append((n, time.perf_counter() - t0))
            cpu[fleet] += backend_cpu(conn) - cpu0
            if n == 0 and len(passes[fleet]) > 1 and passes[fleet][-2][0] == 0:
                done.add(fleet)
    return {f: (passes[f], cpu[f]) for f in fleets}


def measure(url: str, args: argparse.Namespace) -> None:
    load_start = os.getloadavg()[0]
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(SETUP.format(nodes=int(args.nodes)))
        conn.execute(JOBS.format(jobs=int(args.jobs), **MIXED), {"tag": "b"})
        conn.execute(TEAMS.format(teams=int(args.teams), nodes=int(args.nodes)))
        conn.execute(JOBS.format(jobs=int(args.jobs), **{**MIXED, "fleet": 3}), {"tag": "t"})
        conn.execute(TEAM_JOBS.format(teams=int(args.teams)))
        # History first, as a live database has: placements on the single fleet, then statistics. Measured
        # from empty tables, every plan a connection caches (reserve_next's generic plans, the foreign-key
        # checks') is the plan for an empty attempts table, a sequential scan that grows with each placement.
        conn.execute(JOBS.format(jobs=int(args.history), **SINGLE), {"tag": "h"})
        conn.execute("SELECT count(*) FROM tuneplane.reserve_next(2, NULL)")
        conn.execute("ANALYZE")
    with psycopg.connect(url, autocommit=True) as conn:
        measured = alternating(conn, (1, 3), args.pass_size)
        passes, placing_cpu = measured[1]
        placed = sum(n for n, _ in passes)
        placing_time = sum(t for n, t in passes if n)
        team_passes, team_cpu = measured[3]
        team_placed = sum(n for n, _ in team_passes)
        team_time = sum(t for n, t in team_passes if n)
        over_limit = conn.execute(OVER_LIMIT).fetchone()[0]
        bare_time, bare_cpu = bare_inserts(conn, [n for n, _ in passes if n])
        single: list[float] = []
        for i in range(args.single):
            conn.execute(JOBS.format(jobs=1, **SINGLE), {"tag": f"s{i}"})
            t0 = time.perf_counter()
            got = conn.execute("SELECT count(*) FROM tuneplane.reserve_next(2, 10)").fetchone()[0]
            single.append(time.perf_counter() - t0)
            assert got == 1, f"single placement {i} placed {got}"
        doubles = conn.execute(DOUBLE).fetchone()[0]
    batch_rate = placed / placing_time
    single_rate = len(single) / sum(single)
    single.sort()
    p50, p99 = single[len(single) // 2] * 1000, single[int(len(single) * 0.99) - 1] * 1000
    print(
        f"{args.nodes} nodes × 8 GPUs, {args.jobs} queued jobs, passes of {args.pass_size} "
        f"(load average {load_start:.1f} at the start, {os.getloadavg()[0]:.1f} at the end, "
        f"on {os.cpu_count()} CPUs)"
    )
    print(
        f"batch:  {placed} placements in {placing_time:.2f} s = {batch_rate:,.0f}/s "
        f"(ratio to the {TARGET:,.0f}/s target: {batch_rate / TARGET:.2f}); backend CPU {placing_cpu:.2f} s "
        f"= {placed / placing_cpu:,.0f} placements per CPU-second"
    )
    print(
        f"        a pass over {args.pass_size} jobs that cannot be placed (reasons only): "
        f"{min(t for n, t in passes if n == 0) * 1000:.0f} ms"
    )
    print(
        f"single: {len(single)} calls, one job each: {single_rate:,.0f}/s "
        f"(ratio to target: {single_rate / TARGET:.2f}); p50 {p50:.2f} ms, p99 {p99:.2f} ms"
    )
    bare_rate = placed / bare_time
    print(
        f"bare:   the same rows by plain INSERT in {bare_time:.2f} s = {bare_rate:,.0f} placements/s; "
        f"placement / bare INSERT = {batch_rate / bare_rate:.2f} (backend CPU {bare_cpu:.2f} s; "
        f"ratio of CPU per placement {bare_cpu / max(placing_cpu, 1e-9):.2f})"
    )
    team_rate = team_placed / team_time
    print(
        f"teams:  {args.teams} teams with quotas, the same mixed queue: {team_placed} placements in "
        f"{team_time:.2f} s = {team_rate:,.0f}/s (ratio to target: {team_rate / TARGET:.2f}); backend CPU "
        f"{team_cpu:.2f} s = {team_placed / team_cpu:,.0f} placements per CPU-second"
    )
    print(
        f"        with quotas / without: {team_rate / batch_rate:.2f} by wall time, "
        f"{(team_placed / team_cpu) / (placed / placing_cpu):.2f} by backend CPU "
        f"(target {TEAMS_RATIO_TARGET}); teams past their limit: {over_limit}"
    )
    print(f"GPUs allocated twice: {doubles}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--jobs", type=int, default=4000)
    parser.add_argument("--pass-size", type=int, default=250)
    parser.add_argument("--single", type=int, default=500)
    parser.add_argument("--teams", type=int, default=50)
    parser.add_argument("--history", type=int, default=500)
    args = parser.parse_args()
    with migrated_database() as url:
        measure(url, args)


if __name__ == "__main__":
    main()
