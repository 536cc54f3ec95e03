"""The launch side of a job: members, attempts, why it waits, logs and cancel (visibility decided in SQL).

GET  /jobs/<id>/logs?member=R&stream=stdout|stderr&after=OFFSET&limit=BYTES[&attempt=N][&tail=BYTES]
     a bounded read of one member's output: JSON, an htmx partial (appends to the page's <pre>), or a page
POST /jobs/<id>/cancel   [reason]   → cancel_job; JSON, or 303 back to the job page
The job page (app/web/jobs.py) takes members, attempts and the queue position from `launch_details` and
renders its live parts (`?part=live`, `?part=logs`) with the same view.
"""

from __future__ import annotations

from flask import Blueprint, flash, redirect, render_template, request, url_for

from tuneplane.app import db_functions as fn
from tuneplane.app.db import Database
from tuneplane.app.errors import Refusal
from tuneplane.app.submission import service
from tuneplane.app.web.auth import current_user, login_required
from tuneplane.app.web.limits import body_dict, query_int
from tuneplane.app.web.negotiate import json_response, wants_json
from tuneplane.app.web.state import get_db

bp = Blueprint("jobs_launch", __name__)

TERMINAL = ("succeeded", "failed", "cancelled")
STREAMS = ("stdout", "stderr")
LOG_LIMIT = 64 * 1024
# The job page starts each log at most this far from its end (the CLI reads everything).
PAGE_TAIL = 256 * 1024
MAX_REASON = 500
INT4 = 2**31 - 1
INT8 = 2**63 - 1


def is_htmx() -> bool:
    return request.headers.get("HX-Request") == "true"


def int_arg(name: str, default: int | None, maximum: int = INT8) -> int | None:
    return query_int(name, default, -maximum, maximum)


def ordinal(n: int) -> str:
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def waiting_text(row: dict) -> str:
    where = (
        f"{ordinal(row['queue_position'])} in queue (fleet {row['fleet']}, {row['queued_in_fleet']} waiting"
    )
    if row["queue_position"] > 1 and row["head_job_id"] is not None:
        where += f"; job {row['head_job_id']} is at the head"
    where += f"; {ordinal(row['team_position'])} of team {row['team']}'s {row['queued_in_team']}"
    text = f"{where}); {row['state_reason']}"
    # A fleet with quotas: the team's figures of the moment (what it holds, fair share, who is ahead).
    return f"{text}; {row['team_now']}" if row.get("team_now") else text


def launch_details(db: Database, user_id: int, job_id: int, state: str) -> dict:
    """Members, attempts and (while queued) the queue position of a job the user may see."""
    attempts = db.call(fn.job_attempts_of, user_id, job_id)
    # What the grace protocol recorded per attempt (docs/preemption.md), merged into each attempt's row.
    protocol = {row["number"]: row for row in db.call(fn.job_attempt_preemption_of, user_id, job_id)}
    attempts = [{**a, "preemption": protocol.get(a["number"])} for a in attempts]
    members = db.call(fn.job_members_of, user_id, job_id)
    waiting = None
    if state == "queued":
        rows = db.call(fn.job_queue_position, user_id, job_id)
        if rows:
            row = rows[0]
            waiting = {
                "position": row["queue_position"],
                "ordinal": ordinal(row["queue_position"]),
                "queued_in_fleet": row["queued_in_fleet"],
                "fleet": row["fleet"],
                "head_job_id": row["head_job_id"],
                "waiting_seconds": row["waiting"].total_seconds(),
                "reason": row["state_reason"],
                "team": row["team"],
                "team_position": row["team_position"],
                "queued_in_team": row["queued_in_team"],
                "team_now": row["team_now"],
                # The figures of the moment are not part of the stored reason (a placement pass would
                # rewrite every waiting job each time capacity moves); they are computed on read.
                "fit_now": db.call(fn.placement_fit_now, job_id)[0]["placement_fit_now"],
            }
            waiting["text"] = f"{waiting_text(row)}; {waiting['fit_now']}"
    latest = attempts[0]["number"] if attempts else None
    return {
        "terminal": state in TERMINAL,
        "attempts": attempts,
        "members": members,
        "latest_attempt": latest,
        "waiting": waiting,
        "idle": idle_details(db, user_id, job_id),
        "preemptions": db.call(fn.job_preemptions_of, user_id, job_id),
    }


def idle_details(db: Database, user_id: int, job_id: int) -> dict | None:
    """What the idle-GPU policy says of the job (sql/functions/idle.sql): None until it was evaluated."""
    rows = db.call(fn.job_idle_of, user_id, job_id)
    return rows[0] if rows else None


def render_part(part: str, job: dict, events: list[dict]):
    """The job page's live parts, rendered by the job view for htmx polls."""
    if part == "live":
        return render_template("jobs/_live.html", job=job, events=events, oob_events=True)
    if part == "logs":
        known = int_arg("attempt", None, INT4)
        # Nothing changed since the page drew its log panes: no swap (htmx ignores 204).
        if not job["terminal"] and known == (job["latest_attempt"] or 0):
            return "", 204
        return render_template("jobs/_logs.html", job=job)
    raise Refusal("part must be live or logs", status=400, field="part")


def log_url(
    job_id: int, rank: int, stream: str, attempt: int | None, after: int, tail: int | None = None
) -> str:
    args = {"member": rank, "stream": stream, "after": after, "limit": LOG_LIMIT}
    if attempt is not None:
        args["attempt"] = attempt
    if tail is not None:
        args["tail"] = tail
    return url_for("jobs_launch.logs", job_id=job_id, **args)


@bp.app_template_global()
def job_log_url(job_id: int, rank: int, stream: str, attempt: int | None, after: int = 0, tail=None) -> str:
    return log_url(job_id, rank, stream, attempt, after, tail)


@bp.get("/jobs/<job_id>/logs")
@login_required
def logs(job_id: str):
    jid = service.parse_job_id(job_id)
    rank = query_int("member", 0, 0, INT4)
    stream = request.args.get("stream", "stdout")
    if stream not in STREAMS:
        raise Refusal("stream must be stdout or stderr", status=400, field="stream")
    data = get_db().call(
        fn.job_member_log,
        current_user().id,
        jid,
        rank,
        stream,
        query_int("after", 0, 0, INT8),
        query_int("limit", LOG_LIMIT, -INT4 - 1, INT4, clamp=True),  # its range: member_log_settings
        int_arg("attempt", None, INT4),
        query_int("tail", None, 0, INT8),
    )[0]["job_member_log"]
    data["text"] = "".join(chunk["text"] for chunk in data["chunks"])
    if wants_json():
        return json_response(data)
    if is_htmx():
        return render_template("jobs/_log_chunk.html", log=data, first=request.args.get("tail") is not None)
    return render_template("jobs/log.html", title=f"Job {jid} rank {rank} {stream}", log=data)


@bp.post("/jobs/<job_id>/exempt-idle")
@login_required
def exempt_idle(job_id: str):
    """An installation admin exempts a job from the idle-GPU policy (exempt_job_idle: admin only, a reason
    required, recorded on the job's timeline)."""
    jid = service.parse_job_id(job_id)
    reason = body_dict(("reason",)).get("reason")
    if not isinstance(reason, str):
        raise Refusal("reason is required (text)", status=400, field="reason")
    row = get_db().call_retrying(fn.exempt_job_idle, current_user().id, jid, reason)[0]
    if wants_json():
        return json_response({"idle": row})
    flash(f"Job {jid} is exempt from the idle policy", "ok")
    return redirect(url_for("jobs.job_page", job_id=jid), 303)


@bp.post("/jobs/<job_id>/preempt")
@login_required
def preempt(job_id: str):
    """Installation admins: ask the job to checkpoint and stop (docs/preemption.md); it resumes later."""
    jid = service.parse_job_id(job_id)
    grace = body_dict(("grace",)).get("grace")
    if grace is not None and (isinstance(grace, bool) or not isinstance(grace, int)):
        raise Refusal("grace must be a whole number of seconds", status=422, field="grace")
    row = get_db().call_retrying(fn.admin_preempt_job, current_user().id, jid, grace)[0]
    attempt = {
        k: row[k]
        for k in ("number", "state", "stop_kind", "stop_cause", "stop_requested_at", "grace_deadline")
    }
    if wants_json():
        return json_response({"attempt": attempt})
    flash(
        f"Job {jid}: attempt {row['number']} asked to checkpoint and stop by "
        f"{row['grace_deadline']:%H:%M:%S}",
        "ok",
    )
    return redirect(url_for("jobs.job_page", job_id=jid), 303)


@bp.post("/jobs/<job_id>/cancel")
@login_required
def cancel(job_id: str):
    jid = service.parse_job_id(job_id)
    reason = body_dict(("reason",)).get("reason")
    if reason is not None and not isinstance(reason, str):
        raise Refusal("reason must be text", status=400, field="reason")
    reason = (reason or "").strip() or None
    if reason is not None and len(reason) > MAX_REASON:
        raise Refusal(f"reason may be at most {MAX_REASON} characters", status=400, field="reason")
    # Cancel races member reports and placement: a deadlock or serialization failure is run again a few
    # times, then answered 503 (retry), never 500.
    row = get_db().call_retrying(fn.cancel_job, jid, current_user().id, reason)[0]
    job = {k: v for k, v in row.items() if k != "spec"}
    job["preview_id"] = str(job["preview_id"])
    if wants_json():
        return json_response({"job": job})
    flash(f"Cancel requested: {job['state_reason']}", "ok")
    return redirect(url_for("jobs.job_page", job_id=jid), 303)
