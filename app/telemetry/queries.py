"""Bounded metric reads for the console, the HTTP API and the CLI (all authorization is in the SQL)."""

from __future__ import annotations

import math

from tuneplane.app import db_functions as fn
from tuneplane.app.db import Database
from tuneplane.app.errors import Refusal
from tuneplane.app.input_limits import out_of_range

MAX_SERIES = 64
MAX_BUCKETS = 1000
MAX_RAW_PAGE = 1000

CANONICAL_LABELS = {
    "loss": "Loss",
    "eval_loss": "Eval loss",
    "learning_rate": "Learning rate",
    "throughput": "Throughput",
    "grad_norm": "Gradient norm",
    "gpu_utilization": "GPU utilisation",
    "gpu_memory": "GPU memory",
    "gpu_power": "GPU power",
    "cpu_utilization": "CPU utilisation",
    "memory_rss": "Resident memory",
}

# How a canonical metric's values read on a chart's y axis (static/charts.js): bytes in binary units,
# percent (CPU: 100 % is one core), watts. Others are plain numbers.
CANONICAL_UNITS = {
    "gpu_memory": "bytes",
    "memory_rss": "bytes",
    "gpu_utilization": "percent",
    "cpu_utilization": "percent",
    "gpu_power": "watts",
}


def _source_rank(source: str) -> int:
    """Which copy of a metric is shown: JSONL first (float64, as written; TensorBoard keeps float32), then a
    system sample, then any other source."""
    return 0 if source.startswith("jsonl") else 1 if source == "system" else 2


def mark_copies(series: list[dict]) -> None:
    """A metric written twice by the same member (the demo writes JSONL and TensorBoard: `jsonl:…` and
    `tensorboard:…` sources of one canonical name) is shown once, by the charts and by `tuneplane metrics`
    alike: the one rule for which copy is kept. Each series gets `copy_of` (None for the kept one, else the
    kept one's source) and the kept one `copies` (the other sources, in order)."""
    kept: dict[tuple, dict] = {}
    for entry in series:
        key = (entry["attempt"], entry["member"], entry["canonical"] or entry["name"])
        other = kept.get(key)
        if other is None or _source_rank(entry["source"]) < _source_rank(other["source"]):
            kept[key] = entry
    for entry in kept.values():
        entry["copies"] = []
    for entry in series:
        winner = kept[(entry["attempt"], entry["member"], entry["canonical"] or entry["name"])]
        entry["copy_of"] = None if winner is entry else winner["source"]
        if winner is not entry:
            winner["copies"].append(entry["source"])


def finite(value: float | None) -> float | None:
    """A number JSON can carry: NaN and ±Infinity become None (their kind goes in a `non_finite` field)."""
    return value if value is None or math.isfinite(value) else None


def non_finite(value: float | None) -> str | None:
    """'NaN', 'Infinity' or '-Infinity' for a non-finite value, else None."""
    if value is None or math.isfinite(value):
        return None
    if math.isnan(value):
        return "NaN"
    return "Infinity" if value > 0 else "-Infinity"


def _series_json(row: dict) -> dict:
    return {
        "id": row["id"],
        "attempt": row["attempt"],
        "member": row["member_rank"],
        "source": row["source"],
        "name": row["name"],
        "canonical": row["canonical"],
        "point_count": row["point_count"],
        "min_step": row["min_step"],
        "max_step": row["max_step"],
        "last_value": finite(row["last_value"]),
        "last_non_finite": non_finite(row["last_value"]),
        "last_at": row["last_at"],
    }


def job_series(
    db: Database,
    actor_id: int,
    job_id: int,
    *,
    name: str | None = None,
    attempt: int | None = None,
    member: int | None = None,
    source: str | None = None,
) -> list[dict]:
    rows = db.call(fn.telemetry_job_series, actor_id, job_id, name, attempt, member, source)
    return [_series_json(r) for r in rows]


def job_metrics(
    db: Database,
    actor_id: int,
    job_id: int,
    *,
    name: str | None = None,
    attempt: int | None = None,
    member: int | None = None,
    source: str | None = None,
    max_points: int = 500,
    step_from: int | None = None,
    step_to: int | None = None,
    smooth: int | None = None,
) -> dict:
    """Each matching series (canonical ones when no name is given) with at most `max_points` buckets.
    Non-finite values are null with a `non_finite` marker ('NaN', 'Infinity', '-Infinity'), so the answer
    is valid JSON. With `smooth` (a window in steps) each bucket also carries `smoothed`: the trailing mean
    of the full series over that window at the bucket's last step (the same at every zoom). A metric written
    twice by one member keeps both series, the copy marked (`mark_copies`)."""
    if smooth is not None and smooth < 1:
        raise Refusal("smooth must be a window of 1 step or more", 400, "smooth")
    if not 1 <= max_points <= MAX_BUCKETS:
        raise out_of_range("max_points", 1, MAX_BUCKETS)
    series = job_series(db, actor_id, job_id, name=name, attempt=attempt, member=member, source=source)
    if name is None:
        series = [s for s in series if s["canonical"]]
    truncated = len(series) > MAX_SERIES
    series = series[:MAX_SERIES]
    mark_copies(series)
    for entry in series:
        rows = db.call(fn.telemetry_buckets, actor_id, entry["id"], max_points, step_from, step_to)
        entry["buckets"] = [
            {
                "start": r["bucket_start"],
                "end": r["bucket_end"],
                "n": r["n"],
                "min": finite(r["min"]),
                "max": finite(r["max"]),
                "mean": finite(r["mean"]),
                "last_step": r["last_step"],
                "last_value": finite(r["last_value"]),
                "non_finite": non_finite(r["last_value"]),
                "last_wall": finite(r["last_wall"]),
            }
            for r in rows
        ]
        if smooth and entry["buckets"]:
            steps = [b["last_step"] for b in entry["buckets"]]
            smoothed = db.call(fn.telemetry_smoothed, actor_id, entry["id"], smooth, steps)
            for bucket, row in zip(entry["buckets"], smoothed, strict=True):
                bucket["smoothed"] = finite(row["value"])
    return {
        "job_id": job_id,
        "max_points": max_points,
        "smooth": smooth,
        "series": series,
        "truncated": truncated,
    }


def job_health(db: Database, actor_id: int, job_id: int, limit: int = 200) -> dict:
    """Where each member's metrics stand (collecting, complete, incomplete with the reason) and what could
    not be stored: damaged file regions and refused points by reason."""
    members = db.call(fn.telemetry_job_members, actor_id, job_id)
    problems = db.call(fn.telemetry_job_problems, actor_id, job_id, limit)
    states = {m["state"] for m in members}
    if not members:
        summary = "no metrics collector"
    elif states == {"complete"}:
        summary = "metrics complete"
    elif "incomplete" in states:
        summary = "metrics incomplete"
    else:
        summary = "collecting metrics"
    return {
        "summary": summary,
        "members": members,
        "damaged": [p for p in problems if p["kind"] == "damaged"],
        "refused": [p for p in problems if p["kind"] == "refused"],
    }


def raw_page(
    db: Database,
    actor_id: int,
    series_id: int,
    *,
    step_from: int | None = None,
    step_to: int | None = None,
    limit: int = 500,
    skip: int = 0,
) -> dict:
    """One page of exact points, with the cursor of the next page (None at the end)."""
    if not 1 <= limit <= MAX_RAW_PAGE:
        raise out_of_range("limit", 1, MAX_RAW_PAGE)
    rows = db.call(fn.telemetry_raw_points, actor_id, series_id, step_from, step_to, limit + 1, skip)
    more = len(rows) > limit
    rows = [
        {
            "step": r["step"],
            "value": finite(r["value"]),
            "non_finite": non_finite(r["value"]),
            "wall_time": finite(r["wall_time"]),
        }
        for r in rows[:limit]
    ]
    following = None
    if more and rows:
        last = rows[-1]["step"]
        same = sum(1 for r in rows if r["step"] == last)
        following = {"step_from": last, "skip": same + (skip if step_from == last else 0)}
    return {"series_id": series_id, "points": rows, "next": following}
