"""Bounded metric queries: p50/p99 of a 1,000-bucket query over one 10-million-point series, with the
rollups maintained at ingest and over the raw points without them. Targets (with rollups): p50 ≤ 20 ms,
p99 ≤ 50 ms.

Loads one series of --points points (binary COPY in 1M-point chunks, each chunk's rollups merged by
telemetry_merge_batch exactly as the gateway does), VACUUM ANALYZEs, then times
telemetry_series_buckets(series, 1000) over the whole series and over random windows, and the same query
with p_use_rollups = false (raw aggregation). Prints the percentiles and the ratio.

Run: .venv/bin/python bench/telemetry_query.py [--points 10000000] [--database-url URL]
"""

from __future__ import annotations

import argparse
import random
import time

import numpy as np
import psycopg
from telemetry_common import bench_database, job_with_token, percentile

from app.telemetry.ingest import COPY_SQL, aggregates, copy_buffer

MERGE_SQL = (
    "SELECT tuneplane.telemetry_merge_batch(%s::bigint[], %s::int[], %s::bigint[], %s::bigint[],"
    " %s::float8[], %s::float8[], %s::float8[], %s::bigint[], %s::bigint[], %s::float8[],"
    " %s::bigint[], %s::bigint[], %s::bigint[], %s::bigint[], %s::bigint[], %s::float8[],"
    " 'bench', %s, 1, 0, %s, '{}'::jsonb)"
)


def load(url: str, job: int, points: int, chunk: int = 1_000_000) -> int:
    rng = np.random.default_rng(7)
    with psycopg.connect(url, autocommit=True) as conn:
        series = conn.execute(
            "INSERT INTO tuneplane.telemetry_series (job_id, attempt, member_rank, source, name, canonical)"
            " VALUES (%s, 1, 0, 'jsonl:metrics.jsonl', 'train/loss', 'loss') RETURNING id",
            (job,),
        ).fetchone()[0]
        started = time.perf_counter()
        for start in range(0, points, chunk):
            steps = np.arange(start, min(points, start + chunk), dtype=np.int64)
            values = 2.0 * np.exp(-steps / 3e6) + rng.normal(scale=0.05, size=len(steps))
            ids = np.full(len(steps), series, dtype=np.int64)
            with conn.transaction():
                with conn.cursor().copy(COPY_SQL) as copy:
                    copy.write(copy_buffer(ids, steps, values, 1.7e9 + steps * 0.01))
                agg = aggregates(ids, steps, values)
                conn.execute(MERGE_SQL, (*agg.rollups, *agg.series, job, len(steps)))
        print(f"loaded {points:,} points with rollups in {time.perf_counter() - started:.1f}s")
        conn.execute("VACUUM ANALYZE tuneplane.telemetry_points")
        conn.execute("VACUUM ANALYZE tuneplane.telemetry_rollups")
    return series


def timed(
    conn: psycopg.Connection, series: int, rollups: bool, lo: int | None, hi: int | None
) -> tuple[float, int]:
    started = time.perf_counter()
    rows = conn.execute(
        "SELECT * FROM tuneplane.telemetry_series_buckets(%s, 1000, %s, %s, %s)", (series, lo, hi, rollups)
    ).fetchall()
    return (time.perf_counter() - started) * 1000, len(rows)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--points", type=int, default=10_000_000)
    parser.add_argument("--repeat", type=int, default=200)
    parser.add_argument("--raw-repeat", type=int, default=5)
    parser.add_argument("--database-url", default=None)
    args = parser.parse_args()
    with bench_database(args.database_url) as url:
        job, _token = job_with_token(url)
        series = load(url, job, args.points)
        with psycopg.connect(url, autocommit=True) as conn:
            timed(conn, series, True, None, None)  # warm the cache as a live console would be
            whole = [timed(conn, series, True, None, None) for _ in range(args.repeat)]
            rng = random.Random(1)
            windows = []
            for _ in range(args.repeat):
                width = rng.randint(64_000, args.points)
                lo = rng.randint(0, args.points - width)
                windows.append(timed(conn, series, True, lo, lo + width - 1))
            raw = [timed(conn, series, False, None, None) for _ in range(args.raw_repeat)]
        for label, results in (
            ("whole series, rollups", whole),
            ("random windows, rollups", windows),
            ("whole series, raw points", raw),
        ):
            ms = [r[0] for r in results]
            buckets = max(r[1] for r in results)
            print(
                f"{label:26s} p50 {percentile(ms, 50):8.1f} ms  p99 {percentile(ms, 99):8.1f} ms  "
                f"(n={len(ms)}, at most {buckets} buckets)"
            )
        p50 = percentile([r[0] for r in whole], 50)
        raw50 = percentile([r[0] for r in raw], 50)
        print(f"targets with rollups: p50 ≤ 20 ms, p99 ≤ 50 ms; raw/rollup p50 ratio {raw50 / p50:.0f}×")


if __name__ == "__main__":
    main()
