"""Jobs: the list and the job page. Users see their own jobs, admins everyone's (decided in SQL).

GET /jobs[?state=queued&limit=100&before=ID]   the list, newest first
GET /jobs/<id>                                  one job with its event timeline
GET /jobs/<id>?part=live|logs                   the job page's htmx-refreshed parts (app/web/jobs_launch.py)
"""

from __future__ import annotations

from flask import Blueprint, render_template, request

from app.submission import service
from app.web import jobs_launch
from app.web.auth import current_user, login_required
from app.web.limits import query_int
from app.web.negotiate import json_response, wants_json
from app.web.state import get_db

bp = Blueprint("jobs", __name__)

MAX_LIST = 1000
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
    state = request.args.get("state") or None
    limit = query_int("limit", 100, 1, MAX_LIST)
    before = query_int("before", None)
    rows = get_db().call("list_jobs", current_user().id, state, limit, before)
    jobs = [job_json(r) for r in rows]
    if wants_json():
        return json_response({"jobs": jobs})
    return render_template(
        "jobs/list.html", title="Jobs", jobs=jobs, state=state, states=JOB_STATES, limit=limit
    )


@bp.get("/jobs/<job_id>")
@login_required
def job_page(job_id: str):
    jid = service.parse_job_id(job_id)
    db = get_db()
    job = db.call("get_job", current_user().id, jid)[0]
    events = db.call("job_events_of", current_user().id, jid)
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
