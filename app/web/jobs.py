"""Jobs: the list and the job page. Users see their own jobs, admins everyone's (decided in SQL).

GET /jobs[?state=queued&owner=alice&fleet=gpu&limit=50&before=ID]   the list, newest first, by page
GET /jobs/<id>                                  one job with its event timeline
GET /jobs/<id>?part=live|logs                   the job page's htmx-refreshed parts (app/web/jobs_launch.py)
"""

from __future__ import annotations

from flask import Blueprint, render_template, request

from tuneplane.app import db_functions as fn
from tuneplane.app.submission import service
from tuneplane.app.web import jobs_launch
from tuneplane.app.web.auth import current_user, login_required
from tuneplane.app.web.limits import query_int
from tuneplane.app.web.negotiate import json_response, wants_json
from tuneplane.app.web.state import get_db

bp = Blueprint("jobs", __name__)

MAX_LIST = 499  # list_jobs returns at most 500: one more than a page
PAGE = 50
JOB_STATES = ("queued", "reserved", "preparing", "running", "succeeded", "failed", "cancelled")


def job_json(row: dict, with_spec: bool = False) -> dict:
    data = {k: v for k, v in row.items() if k != "spec"}
    data["preview_id"] = str(row["preview_id"])
    if with_spec:
        data["spec"] = row["spec"]
    return data


@bp.get("/jobs")
@login_required
def jobs_list():
    names = ("state", "owner", "fleet", "team")
    filters = {name: (request.args.get(name) or "").strip() or None for name in names}
    limit = query_int("limit", PAGE, 1, MAX_LIST)
    before = query_int("before", None)
    # One more than the page: whether an older page exists, without counting.
    rows = get_db().call(
        fn.list_jobs,
        current_user().id,
        filters["state"],
        limit + 1,
        before,
        filters["owner"],
        filters["fleet"],
        filters["team"],
    )
    jobs = [job_json(r) for r in rows[:limit]]
    older = jobs[-1]["id"] if len(rows) > limit else None
    if wants_json():
        return json_response({"jobs": jobs, "next_before": older})
    db = get_db()
    choices = {
        "fleets": [r["name"] for r in db.fetch_all("SELECT name FROM fleets ORDER BY name")],
        "owners": [r["owner"] for r in db.call(fn.job_owners_visible, current_user().id)],
        # The teams whose jobs the user may read (the same rule as the Usage page's team filter).
        "teams": [r["name"] for r in db.call(fn.usage_teams_of, current_user().id)],
    }
    return render_template(
        "jobs/list.html",
        title="Jobs",
        jobs=jobs,
        filters=filters,
        states=JOB_STATES,
        limit=limit,
        before=before,
        older=older,
        **choices,
    )


@bp.get("/jobs/<job_id>")
@login_required
def job_page(job_id: str):
    jid = service.parse_job_id(job_id)
    db = get_db()
    job = db.call(fn.get_job, current_user().id, jid)[0]
    events = db.call(fn.job_events_of, current_user().id, jid)
    data = job_json(job, with_spec=True)
    data["events"] = events
    # Launch (issue 5): members, attempts, queue position; the page's live parts come from this view too.
    data.update(jobs_launch.launch_details(db, current_user().id, jid, job["state"]))
    if wants_json():
        return json_response(data)
    if request.args.get("part"):
        return jobs_launch.render_part(request.args["part"], data, events)
    summary = service.summary(job["spec"])
    return render_template("jobs/job.html", title=f"Job {jid}", job=data, events=events, summary=summary)
