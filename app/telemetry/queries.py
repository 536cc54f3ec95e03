"""Bounded metric reads for the console, the HTTP API and the CLI (all authorization is in the SQL)."""

from __future__ import annotations

from app.db import Database
from app.errors import Refusal

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
}


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
        "last_value": row["last_value"],
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
    rows = db.call("telemetry_job_series", actor_id, job_id, name, attempt, member, source)
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
) -> dict:
    """Each matching series (canonical ones when no name is given) with at most `max_points` buckets."""
    if not 1 <= max_points <= MAX_BUCKETS:
        raise Refusal(f"max_points must be between 1 and {MAX_BUCKETS}", 400, "max_points")
    series = job_series(db, actor_id, job_id, name=name, attempt=attempt, member=member, source=source)
    if name is None:
        series = [s for s in series if s["canonical"]]
    truncated = len(series) > MAX_SERIES
    series = series[:MAX_SERIES]
    for entry in series:
        rows = db.call("telemetry_buckets", actor_id, entry["id"], max_points, step_from, step_to)
        entry["buckets"] = [
            {
                "start": r["bucket_start"],
                "end": r["bucket_end"],
                "n": r["n"],
                "min": r["min"],
                "max": r["max"],
                "mean": r["mean"],
                "last_step": r["last_step"],
                "last_value": r["last_value"],
            }
            for r in rows
        ]
    return {"job_id": job_id, "max_points": max_points, "series": series, "truncated": truncated}


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
        raise Refusal(f"limit must be between 1 and {MAX_RAW_PAGE}", 400, "limit")
    rows = db.call("telemetry_raw_points", actor_id, series_id, step_from, step_to, limit + 1, skip)
    more = len(rows) > limit
    rows = rows[:limit]
    following = None
    if more and rows:
        last = rows[-1]["step"]
        same = sum(1 for r in rows if r["step"] == last)
        following = {"step_from": last, "skip": same + (skip if step_from == last else 0)}
    return {"series_id": series_id, "points": rows, "next": following}
