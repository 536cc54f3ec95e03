"""One bounded read of a member's log made of many small chunks (issue 10, item 13: target < 100 ms for
1 MiB of small chunks; the jsonb-append loop it replaced took 9 s).

Stores --bytes of stdout for one member as chunks of --chunk bytes (plain INSERTs: the setup, not the path
under test), then times job_member_log reading all of it in one call (limit = --bytes) and reading a
quarter of it; a linear read takes about 4x as long for 4x the chunks (the old loop took about 16x).
Run: .venv/bin/python bench/member_log_read.py [--bytes 1048576] [--chunk 64] [--calls 10]
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

TARGET_MS = 100.0

SETUP = """
INSERT INTO tuneplane.users (username, role) VALUES ('bench', 'user');
INSERT INTO tuneplane.fleets (name, backend) VALUES ('bench', 'node');
INSERT INTO tuneplane.nodes (fleet_id, name, cpus, memory_bytes, address) VALUES (1, 'n1', 8, 1, '10.0.0.1');
INSERT INTO tuneplane.previews (owner_id, fleet_id, spec, resolved, canonical, digest, expires_at)
VALUES (1, 1, '{{}}', '{{}}', 'p', md5('p') || md5('q'), now() + interval '1 day');
INSERT INTO tuneplane.jobs (owner_id, preview_id, fleet_id, state, state_reason, nodes, gpus_per_node,
                            cpus_per_node, memory_per_node, max_attempts, spec)
SELECT 1, id, 1, 'running', 'bench', 1, 0, 1, 0, 1, '{{}}' FROM tuneplane.previews;
INSERT INTO tuneplane.attempts (job_id, number, fleet_id, state) VALUES (1, 1, 1, 'running');
INSERT INTO tuneplane.members (attempt_id, job_id, rank, node_id, cpus, memory_bytes, state)
VALUES (1, 1, 0, 1, 1, 0, 'running');
INSERT INTO tuneplane.member_log_streams (member_id, stream, next_offset, stored_bytes, chunks)
VALUES (1, 'stdout', {bytes}, {bytes}, {bytes} / {chunk});
INSERT INTO tuneplane.member_log_chunks (member_id, stream, start_offset, end_offset, text)
SELECT 1, 'stdout', o, o + {chunk}, repeat('x', {chunk} - 1) || E'\\n'
  FROM generate_series(0::bigint, {bytes} - {chunk}, {chunk}) o;
"""
READ = "SELECT tuneplane.job_member_log(1, 1, 0, 'stdout', 0, %s)"


def timed(conn: psycopg.Connection, limit: int, calls: int) -> tuple[float, dict]:
    times = []
    answer: dict = {}
    for _ in range(calls):
        t0 = time.perf_counter()
        answer = conn.execute(READ, (limit,)).fetchone()[0]
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1000, answer


def measure(url: str, args: argparse.Namespace) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(SETUP.format(bytes=int(args.bytes), chunk=int(args.chunk)))
        conn.execute("VACUUM ANALYZE tuneplane.member_log_chunks")
        whole, answer = timed(conn, args.bytes, args.calls)
        quarter, _ = timed(conn, args.bytes // 4, args.calls)
    assert answer["bytes"] == args.bytes and not answer["more"], answer["bytes"]
    chunks = len(answer["chunks"])
    print(
        f"one read of {args.bytes:,} bytes in {chunks:,} chunks of {args.chunk} bytes: {whole:.1f} ms "
        f"(median of {args.calls}; ratio to the {TARGET_MS:.0f} ms target: {whole / TARGET_MS:.2f})"
    )
    print(
        f"a quarter of it ({chunks // 4:,} chunks): {quarter:.1f} ms; 4x the chunks took "
        f"{whole / quarter:.1f}x as long (linear: about 4)"
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--bytes", type=int, default=1024 * 1024)
    parser.add_argument("--chunk", type=int, default=64)
    parser.add_argument("--calls", type=int, default=10)
    args = parser.parse_args()
    with migrated_database() as url:
        measure(url, args)


if __name__ == "__main__":
    main()
