"""Storing one batch: ledger and series (telemetry_begin_batch), a binary COPY of the points, then the
rollups and series summaries (telemetry_merge_batch), all in one transaction.

The COPY stream and the rollup aggregates are built with numpy from the batch's columns, so the gateway
spends no per-point Python time.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, replace

import numpy as np
import psycopg

from tuneplane.app.telemetry import limits
from tuneplane.app.telemetry.pg_arrays import Float8Array, Int4Array, Int8Array, PgArray
from tuneplane.app.telemetry.wire import Batch

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


def _row_template(n: int) -> np.ndarray:
    rows = np.empty(n, dtype=_ROW)
    rows["fields"] = 4
    rows["l_series"] = 8
    rows["l_step"] = 8
    rows["l_value"] = 8
    rows["l_wall"] = 8
    return rows


_TEMPLATE = _row_template(65536)


def copy_buffer(series_ids: np.ndarray, steps: np.ndarray, values: np.ndarray, walls: np.ndarray) -> bytes:
    """PostgreSQL's binary COPY format for (series_id, step, value, wall_time) rows."""
    n = len(steps)
    # The field count and lengths are the same in every row: copied from a template in one pass.
    rows = _TEMPLATE[:n].copy() if n <= len(_TEMPLATE) else _row_template(n)
    rows["series"] = series_ids
    rows["step"] = steps
    rows["value"] = values
    rows["wall"] = walls
    return _COPY_HEADER + rows.tobytes() + _COPY_TRAILER


@dataclass
class Aggregates:
    rollups: tuple[PgArray, ...]  # the r_* arguments of telemetry_merge_batch (r_last_wall last)
    series: tuple[PgArray, ...]  # the s_* arguments


_ROLLUP_TYPES = (Int8Array, Int4Array, Int8Array, Int8Array, Float8Array, Float8Array, Float8Array,
                 Int8Array, Int8Array, Float8Array, Float8Array)  # fmt: skip
_SERIES_TYPES = (Int8Array, Int8Array, Int8Array, Int8Array, Int8Array, Float8Array)
# An all-NaN bucket has no min or max, and a point without a wall time has none: NULL, not NaN.
_NULL_WHEN_NAN = (5, 6, 10)


def aggregates(
    series_ids: np.ndarray, steps: np.ndarray, values: np.ndarray, walls: np.ndarray
) -> Aggregates:
    if len(steps) == 0:
        return Aggregates(tuple(t([]) for t in _ROLLUP_TYPES), tuple(t([]) for t in _SERIES_TYPES))
    if _sorted_by_series_and_step(series_ids, steps):
        sid, st, val, wall = series_ids, steps, values, walls  # as collectors send them: no sort needed
    else:
        order = np.lexsort((steps, series_ids))
        sid, st, val, wall = series_ids[order], steps[order], values[order], walls[order]
    finite = np.isfinite(val)
    fin_val = np.where(finite, val, 0.0)
    nan_val = np.where(finite, val, np.nan)
    fin_n = finite.astype(np.int64)
    n = len(st)
    series_change = np.empty(n, dtype=bool)
    series_change[0] = True
    np.not_equal(sid[1:], sid[:-1], out=series_change[1:])

    r_cols: list[list] = [[] for _ in range(11)]
    for width in ROLLUP_WIDTHS:
        bucket = np.floor_divide(st, width)
        change = series_change.copy()
        change[1:] |= bucket[1:] != bucket[:-1]
        starts = np.flatnonzero(change)
        ends = np.append(starts[1:], n) - 1
        with np.errstate(invalid="ignore"):
            mins = np.fmin.reduceat(nan_val, starts)
            maxs = np.fmax.reduceat(nan_val, starts)
        parts = (
            sid[starts],
            np.full(len(starts), width, dtype=np.int32),
            bucket[starts],
            np.add.reduceat(fin_n, starts),
            np.add.reduceat(fin_val, starts),
            mins,
            maxs,
            st[starts],
            st[ends],
            val[ends],
            wall[ends],
        )
        for col, part in zip(r_cols, parts, strict=True):
            col.append(part)
    rollups = []
    for i, (kind, col) in enumerate(zip(_ROLLUP_TYPES, r_cols, strict=True)):
        joined = np.concatenate(col)
        rollups.append(kind(joined, np.isnan(joined) if i in _NULL_WHEN_NAN else None))
    starts = np.flatnonzero(series_change)
    ends = np.append(starts[1:], n) - 1
    columns = (sid[starts], np.diff(np.append(starts, n)), st[starts], st[ends], st[ends], val[ends])
    series = tuple(kind(col) for kind, col in zip(_SERIES_TYPES, columns, strict=True))
    return Aggregates(tuple(rollups), series)


def _sorted_by_series_and_step(series_ids: np.ndarray, steps: np.ndarray) -> bool:
    same_series = series_ids[1:] == series_ids[:-1]
    return bool(
        (series_ids[1:] >= series_ids[:-1]).all() and (~same_series | (steps[1:] >= steps[:-1])).all()
    )


def batch_digest(payload: bytes) -> str:
    return hashlib.sha256(payload).hexdigest()


def point_series(batch: Batch, ids: list[int]) -> np.ndarray:
    counts = [count for _, _, count in batch.series]
    return np.repeat(np.asarray(ids, dtype=np.int64), counts)


def screen(batch: Batch, series_refused: list[str | None] | None = None) -> Batch:
    """The batch without the points that may not be stored (a bad source or name, a step outside the
    documented range, or a series the database refused: `series_refused[i]` is series i's reason), each
    refused point counted in `batch.refused` with its reason. The points of one series stay together."""
    if not batch.count and not batch.series:
        return batch
    counts = np.fromiter((c for _, _, c in batch.series), dtype=np.int64, count=len(batch.series))
    ends = np.cumsum(counts)
    keep = limits.steps_in_range(batch.steps)
    refused = list(batch.refused)
    series: list[tuple[str, str, int]] = []
    for index, (source, name, count) in enumerate(batch.series):
        lo, hi = int(ends[index] - count), int(ends[index])
        why = series_refused[index] if series_refused else None
        problem = limits.name_problem(source)
        if problem is not None:
            why = f"source: {problem}"
        why = why or limits.name_problem(name)
        shown_source = source if limits.name_problem(source) is None else ""
        shown_name = name if limits.name_problem(name) is None else ""
        if why is not None:
            keep[lo:hi] = False
            if count:
                refused.append((shown_source, shown_name, why, count))
            continue
        kept = int(keep[lo:hi].sum())
        if kept < count:
            refused.append((source, name, limits.STEP_RANGE, count - kept))
        if kept:
            series.append((source, name, kept))
    if len(refused) == len(batch.refused):
        return batch  # nothing refused: the batch as it came
    return replace(
        batch,
        series=series,
        steps=batch.steps[keep],
        values=batch.values[keep],
        wall_times=batch.wall_times[keep],
        refused=refused,
    )


_BEGIN_SQL = (
    "SELECT * FROM tuneplane.telemetry_begin_batch(%s, %s, %s, %s, %s, %s::jsonb, %s::text[], %s::text[])"
)
_MERGE_SQL = (
    "SELECT tuneplane.telemetry_merge_batch(%s, %s, %s, %s::bigint[], %s::int[], %s::bigint[], %s::bigint[],"
    " %s::float8[], %s::float8[], %s::float8[], %s::bigint[], %s::bigint[], %s::float8[], %s::float8[],"
    " %s::bigint[], %s::bigint[], %s::bigint[], %s::bigint[], %s::bigint[], %s::float8[],"
    " %s, %s::jsonb, %s::text[], %s::text[], %s::text[], %s::bigint[],"
    " %s::text[], %s::text[], %s::bigint[], %s::bigint[], %s::text[], %s)"
)


async def store_batch(conn: psycopg.AsyncConnection, token_hash: str, batch: Batch, digest: str) -> dict:
    """Store `batch` in one transaction; {"stored": n, "refused": m, "duplicate": bool}. Points that may
    not be stored are refused one by one and counted with their reasons; the rest is stored. The rows
    other batches also touch (series, rollup buckets, the collector's row) are locked last, after the
    COPY, so that batches sent in parallel overlap."""
    offered = batch.count
    batch = screen(batch)
    async with conn.transaction():
        cur = await conn.execute(
            _BEGIN_SQL,
            (
                token_hash,
                batch.collector,
                batch.seq,
                digest,
                offered,
                json.dumps(batch.scope) if batch.scope else None,
                [s for s, _, _ in batch.series],
                [n for _, n, _ in batch.series],
            ),
        )
        row = await cur.fetchone()
        if row["duplicate"]:
            return {"stored": 0, "refused": 0, "duplicate": True, "seq": batch.seq}
        ids = row["series_ids"]
        if any(i is None for i in ids):  # over the member's series cap: those series' points alone
            batch = screen(batch, row["refused"])
            ids = [i for i in ids if i is not None]
        sids = point_series(batch, ids)
        if batch.count:
            async with conn.cursor().copy(COPY_SQL) as copy:
                await copy.write(copy_buffer(sids, batch.steps, batch.values, batch.wall_times))
        agg = aggregates(sids, batch.steps, batch.values, batch.wall_times)
        refused, damage = batch.refused, batch.damage
        await conn.execute(
            _MERGE_SQL,
            (
                token_hash,
                batch.collector,
                batch.seq,
                *agg.rollups,
                *agg.series,
                batch.count,
                json.dumps(batch.health or {}),
                [r[0] for r in refused],
                [r[1] for r in refused],
                [r[2] for r in refused],
                [r[3] for r in refused],
                [d[0] for d in damage],
                [d[1] for d in damage],
                [d[2] for d in damage],
                [d[3] for d in damage],
                [d[4] for d in damage],
                batch.final,
            ),
        )
        n_refused = sum(r[3] for r in refused)
        return {"stored": batch.count, "refused": n_refused, "duplicate": False, "seq": batch.seq}
