"""Storing one batch: ledger and series (telemetry_begin_batch), a binary COPY of the points, then the
rollups and series summaries (telemetry_merge_batch), all in one transaction.

The COPY stream and the rollup aggregates are built with numpy from the batch's columns, so the gateway
spends no per-point Python time.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass

import numpy as np
import psycopg

from app.telemetry.wire import Batch

ROLLUP_WIDTHS = (64, 512, 4096, 32768)
COPY_SQL = "COPY tuneplane.telemetry_points (series_id, step, value, wall_time) FROM STDIN (FORMAT BINARY)"
_COPY_HEADER = b"PGCOPY\n\xff\r\n\x00" + (0).to_bytes(4, "big") + (0).to_bytes(4, "big")
_COPY_TRAILER = (-1).to_bytes(2, "big", signed=True)
_ROW = np.dtype(
    [
        ("fields", ">i2"),
        ("l_series", ">i4"),
        ("series", ">i8"),
        ("l_step", ">i4"),
        ("step", ">i8"),
        ("l_value", ">i4"),
        ("value", ">f8"),
        ("l_wall", ">i4"),
        ("wall", ">f8"),
    ]
)


def copy_buffer(series_ids: np.ndarray, steps: np.ndarray, values: np.ndarray, walls: np.ndarray) -> bytes:
    """PostgreSQL's binary COPY format for (series_id, step, value, wall_time) rows."""
    rows = np.empty(len(steps), dtype=_ROW)
    rows["fields"] = 4
    rows["l_series"] = 8
    rows["l_step"] = 8
    rows["l_value"] = 8
    rows["l_wall"] = 8
    rows["series"] = series_ids
    rows["step"] = steps
    rows["value"] = values
    rows["wall"] = walls
    return _COPY_HEADER + rows.tobytes() + _COPY_TRAILER


@dataclass
class Aggregates:
    rollups: tuple[list, ...]  # the r_* arguments of telemetry_merge_batch
    series: tuple[list, ...]  # the s_* arguments


def aggregates(series_ids: np.ndarray, steps: np.ndarray, values: np.ndarray) -> Aggregates:
    if len(steps) == 0:
        return Aggregates(tuple([] for _ in range(10)), tuple([] for _ in range(6)))
    order = np.lexsort((steps, series_ids))
    sid = series_ids[order]
    st = steps[order]
    val = values[order]
    finite = np.isfinite(val)
    fin_val = np.where(finite, val, 0.0)
    nan_val = np.where(finite, val, np.nan)
    fin_n = finite.astype(np.int64)
    n = len(st)

    def groups(keys: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
        change = np.zeros(n, dtype=bool)
        change[0] = True
        for key in keys:
            change[1:] |= key[1:] != key[:-1]
        starts = np.flatnonzero(change)
        ends = np.append(starts[1:], n) - 1
        return starts, ends

    r_cols: list[list] = [[] for _ in range(10)]
    for width in ROLLUP_WIDTHS:
        bucket = np.floor_divide(st, width)
        starts, ends = groups([sid, bucket])
        with np.errstate(invalid="ignore"):
            mins = np.fmin.reduceat(nan_val, starts)
            maxs = np.fmax.reduceat(nan_val, starts)
        parts = (
            sid[starts],
            np.full(len(starts), width, dtype=np.int64),
            bucket[starts],
            np.add.reduceat(fin_n, starts),
            np.add.reduceat(fin_val, starts),
            mins,
            maxs,
            st[starts],
            st[ends],
            val[ends],
        )
        for col, part in zip(r_cols, parts, strict=True):
            col.append(part)
    rollups = tuple(
        _nan_to_none(np.concatenate(col)) if i in (5, 6) else np.concatenate(col).tolist()
        for i, col in enumerate(r_cols)
    )
    starts, ends = groups([sid])
    series = (
        sid[starts].tolist(),
        np.diff(np.append(starts, n)).tolist(),
        st[starts].tolist(),
        st[ends].tolist(),
        st[ends].tolist(),
        val[ends].tolist(),
    )
    return Aggregates(rollups, series)


def _nan_to_none(column: np.ndarray) -> list:
    # An all-NaN bucket has no min/max: NULL, not NaN.
    return [None if x != x else x for x in column.tolist()]


def batch_digest(payload: bytes) -> str:
    return hashlib.sha256(payload).hexdigest()


def point_series(batch: Batch, ids: list[int]) -> np.ndarray:
    counts = [count for _, _, count in batch.series]
    return np.repeat(np.asarray(ids, dtype=np.int64), counts)


async def store_batch(conn: psycopg.AsyncConnection, token_hash: str, batch: Batch, digest: str) -> dict:
    """Store `batch` in one transaction; {"stored": n, "duplicate": bool}. The rows other batches also
    touch (series, rollup buckets, the collector's row) are locked last, after the COPY, so that batches
    sent in parallel overlap."""
    async with conn.transaction():
        cur = await conn.execute(
            "SELECT * FROM tuneplane.telemetry_begin_batch"
            "(%s, %s, %s, %s, %s, %s::jsonb, %s::text[], %s::text[])",
            (
                token_hash,
                batch.collector,
                batch.seq,
                digest,
                batch.count,
                json.dumps(batch.scope) if batch.scope else None,
                [s for s, _, _ in batch.series],
                [n for _, n, _ in batch.series],
            ),
        )
        row = await cur.fetchone()
        if row["duplicate"]:
            return {"stored": 0, "duplicate": True, "seq": batch.seq}
        sids = point_series(batch, row["series_ids"])
        if batch.count:
            async with conn.cursor().copy(COPY_SQL) as copy:
                await copy.write(copy_buffer(sids, batch.steps, batch.values, batch.wall_times))
        agg = aggregates(sids, batch.steps, batch.values)
        await conn.execute(
            "SELECT tuneplane.telemetry_merge_batch(%s::bigint[], %s::int[], %s::bigint[], %s::bigint[],"
            " %s::float8[], %s::float8[], %s::float8[], %s::bigint[], %s::bigint[], %s::float8[],"
            " %s::bigint[], %s::bigint[], %s::bigint[], %s::bigint[], %s::bigint[], %s::float8[],"
            " %s, %s, %s, %s, %s, %s::jsonb)",
            (
                *agg.rollups,
                *agg.series,
                batch.collector,
                row["job_id"],
                row["attempt"],
                row["member_rank"],
                batch.count,
                json.dumps(batch.health or {}),
            ),
        )
        return {"stored": batch.count, "duplicate": False, "seq": batch.seq}
