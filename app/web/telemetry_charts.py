"""Job Charts: canonical metrics with attempts, members and sources overlaid (several jobs compared on one
chart at `/charts/compare?jobs=1,2`), the raw scalar inspector, what could not be stored (damaged file
regions, refused points) and whether each member's metrics are complete, and the bounded metric endpoints
the charts, the CLI and API clients read (`/jobs/<id>/metrics`, `/…/raw`, `/…/metrics/health`)."""

from __future__ import annotations

import psycopg
from flask import Blueprint, request

from tuneplane.app.errors import Refusal
from tuneplane.app.input_limits import INT_PARAMS
from tuneplane.app.telemetry import queries
from tuneplane.app.web.auth import current_user, login_required
from tuneplane.app.web.limits import query_int
from tuneplane.app.web.negotiate import json_response, respond
from tuneplane.app.web.state import get_db

bp = Blueprint("telemetry", __name__)
# The chart cards' y-axis units (templates/telemetry/_chart_parts.html: a global, so the macro sees it).
bp.record_once(lambda state: state.app.jinja_env.globals.update(canonical_units=queries.CANONICAL_UNITS))

TERMINAL = ("succeeded", "failed", "cancelled")


def _int_arg(name: str, default: int | None = None) -> int | None:
    """An integer query parameter within its declared range (input_limits.INT_PARAMS: `member` is an SQL
    integer, so 2147483648 is refused here, not by PostgreSQL's function lookup)."""
    declared = INT_PARAMS[name]
    assert declared is not None, name
    return query_int(name, default, *declared)


def _job_state(job_id: int) -> str | None:
    try:
        row = get_db().fetch_one("SELECT state FROM jobs WHERE id = %s", (job_id,))
    except psycopg.errors.UndefinedTable:
        return None
    return row["state"] if row else None


def _live_version(job_id: int) -> str:
    row = get_db().fetch_one(
        "SELECT coalesce(sum(point_count), 0) AS n, max(last_at) AS at"
        " FROM telemetry_series WHERE job_id = %s",
        (job_id,),
    )
    return f"{row['n']}:{row['at'].timestamp() if row['at'] else 0}"


@bp.get("/jobs/<int:job_id>/metrics")
@login_required
def metrics(job_id: int):
    data = queries.job_metrics(
        get_db(),
        current_user().id,
        job_id,
        name=request.args.get("name") or None,
        attempt=_int_arg("attempt"),
        member=_int_arg("member"),
        source=request.args.get("source") or None,
        max_points=query_int("max_points", 500, 1, queries.MAX_BUCKETS),
        step_from=_int_arg("step_from"),
        step_to=_int_arg("step_to"),
        smooth=_int_arg("smooth"),
    )
    return json_response(data)


@bp.get("/jobs/<int:job_id>/metrics/health")
@login_required
def health(job_id: int):
    """Metrics complete or what is missing, damaged regions and refused points (job page, charts, CLI)."""
    data = queries.job_health(get_db(), current_user().id, job_id)
    return respond("telemetry/_health.html", {"job_id": job_id, **data}, json_data=data)


@bp.get("/charts/compare")
@login_required
def compare():
    """Several jobs' canonical metrics on shared charts (jobs picked on the jobs list or by id)."""
    raw = ",".join(request.args.getlist("jobs"))  # jobs=1,2 or the jobs list's jobs=1&jobs=2
    ids: list[int] = []
    for part in raw.replace(" ", ",").split(","):
        if not part:
            continue
        if not (part.isascii() and part.isdigit()) or len(part) > 18:
            raise Refusal(f"jobs: {part[:40]!r} is not a job id", 400, "jobs")
        if int(part) not in ids:
            ids.append(int(part))
    if not ids:
        raise Refusal("jobs: name at least one job id (jobs=12,15)", 400, "jobs")
    if len(ids) > 8:
        raise Refusal("jobs: at most 8 jobs on one chart", 400, "jobs")
    present: dict[str, set[int]] = {}
    for job_id in ids:
        for entry in queries.job_series(get_db(), current_user().id, job_id):
            if entry["canonical"]:
                present.setdefault(entry["canonical"], set()).add(job_id)
    ordered = [(c, queries.CANONICAL_LABELS[c]) for c in queries.CANONICAL_LABELS if c in present]
    data = {"title": "Compare jobs", "job_ids": ids, "canonical": ordered}
    return respond(
        "telemetry/compare.html", data, json_data={"jobs": ids, "canonical": [c for c, _ in ordered]}
    )


@bp.get("/jobs/<int:job_id>/metrics/raw")
@login_required
def raw(job_id: int):
    series_id = _int_arg("series")
    if series_id is None:
        raise Refusal("series is required", 400, "series")
    page = queries.raw_page(
        get_db(),
        current_user().id,
        series_id,
        step_from=_int_arg("step_from"),
        step_to=_int_arg("step_to"),
        limit=query_int("limit", 200, 1, queries.MAX_RAW_PAGE),
        skip=query_int("skip", 0, 0, 2**31 - 1),
    )
    series = [s for s in queries.job_series(get_db(), current_user().id, job_id) if s["id"] == series_id]
    if not series:
        raise Refusal(f"no such series in job {job_id}", 404, "series")
    page["series"] = series[0]
    return respond("telemetry/_raw_page.html", {"job_id": job_id, **page}, json_data=page)


@bp.get("/jobs/<int:job_id>/charts")
@login_required
def charts(job_id: int):
    series = queries.job_series(get_db(), current_user().id, job_id)
    state = _job_state(job_id)
    groups: dict[str, list[dict]] = {}
    for entry in series:
        if entry["canonical"]:
            groups.setdefault(entry["canonical"], []).append(entry)
    ordered = [(c, queries.CANONICAL_LABELS[c], groups[c]) for c in queries.CANONICAL_LABELS if c in groups]
    last_at = max((s["last_at"] for s in series if s["last_at"]), default=None)
    data = {
        "title": f"Job {job_id} charts",
        "job_id": job_id,
        "job_state": state,
        "live": state not in TERMINAL,
        "canonical": ordered,
        "series": series,
        "attempts": sorted({s["attempt"] for s in series}),
        "sources": sorted({s["source"] for s in series}),
        "last_at": last_at,
        "version": _live_version(job_id),
        "health": queries.job_health(get_db(), current_user().id, job_id),
    }
    return respond("telemetry/charts.html", data, json_data={"job_id": job_id, "series": series})


@bp.get("/jobs/<int:job_id>/charts/tick")
@login_required
def tick(job_id: int):
    queries.job_series(get_db(), current_user().id, job_id, name="-")  # authorization only
    state = _job_state(job_id)
    data = {
        "job_id": job_id,
        "version": _live_version(job_id),
        "live": state not in TERMINAL,
        "job_state": state,
    }
    return respond("telemetry/_tick.html", data)
