"""Bounded metric queries: p50/p99 of a 1,000-bucket query over one 10-million-point series, with the
rollups maintained at ingest and over the raw points without them. Targets (with rollups): p50 ≤ 20 ms,
p99 ≤ 50 ms.

Loads one series of --points points (each 1M-point chunk stored by app.telemetry.ingest.store_batch, the
gateway's own ingest transaction: ledger, binary COPY, rollups), VACUUM ANALYZEs, then times
telemetry_series_buckets(series, 1000) over the whole series and over random windows, and the same query
with p_use_rollups = false (raw aggregation). Prints the percentiles and the ratio.

Run: .venv/bin/python bench/telemetry_query.py [--points 10000000] [--database-url URL]
"""

from __future__ import annotations

import argparse
import asyncio
import random
import time

import numpy as np
import psycopg
from psycopg.rows import dict_row
from telemetry_common import bench_database, job_with_token, percentile

from tuneplane.app.db import SEARCH_PATH_OPTION
from tuneplane.app.security import token_hash
from tuneplane.app.telemetry import wire
from tuneplane.app.telemetry.ingest import batch_digest, store_batch


async def _store_all(url: str, token: str, points: int, chunk: int) -> None:
    rng = np.random.default_rng(7)
    async with await psycopg.AsyncConnection.connect(
        url, autocommit=True, row_factory=dict_row, options=SEARCH_PATH_OPTION
    ) as conn:
        await conn.execute("UPDATE tuneplane.telemetry_settings SET max_batch_points = %s", (chunk,))
        for seq, start in enumerate(range(0, points, chunk), start=1):
            steps = np.arange(start, min(points, start + chunk), dtype=np.int64)
            values = 2.0 * np.exp(-steps / 3e6) + rng.normal(scale=0.05, size=len(steps))
            payload = wire.encode(
                "bench",
                seq,
                [("jsonl:metrics.jsonl", "train/loss", len(steps))],
                steps,
                values,
                1.7e9 + steps * 0.01,
            )
            await store_batch(conn, token_hash(token), wire.decode(payload), batch_digest(payload))


def load(url: str, token: str, points: int, chunk: int = 1_000_000) -> int:
    started = time.perf_counter()
    asyncio.run(_store_all(url, token, points, chunk))
    print(f"loaded {points:,} points with rollups in {time.perf_counter() - started:.1f}s")
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("VACUUM ANALYZE tuneplane.telemetry_points")
        conn.execute("VACUUM ANALYZE tuneplane.telemetry_rollups")
        return conn.execute(
            "SELECT id FROM tuneplane.telemetry_series WHERE name = 'train/loss' ORDER BY id DESC LIMIT 1"
        ).fetchone()[0]


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
        _job, token = job_with_token(url)
        series = load(url, token, args.points)
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
