"""The console's home page: a dashboard of my recent jobs (state and why), the fleets (connected nodes,
free GPUs) and a Submit button; a visitor who is not logged in is asked to log in.

GET /   HTML, or JSON {"jobs": [...], "fleets": [{fleet, nodes, connected, gpus, free_gpus, ...}]}
"""

from __future__ import annotations

from flask import Blueprint

from tuneplane.app import db_functions as fn
from tuneplane.app.web.auth import current_user
from tuneplane.app.web.negotiate import respond
from tuneplane.app.web.state import get_db

bp = Blueprint("home", __name__)

RECENT_JOBS = 8


def _fleets() -> list[dict]:
    # free_gpus: what a new job could get now (v_fleet's rule, as the fleets overview).
    return get_db().fetch_all(
        "SELECT fleet, backend, nodes, connected, stale, lost, gpus, schedulable_gpus, allocated_gpus,"
        " free_gpus FROM v_fleet ORDER BY fleet"
    )


@bp.get("/")
def index():
    user = current_user()
    if user is None:
        return respond("home.html", {"title": "TunePlane", "jobs": None, "fleets": None})
    from tuneplane.app.web.jobs import job_json

    db = get_db()
    rows = db.call(fn.list_jobs, user.id, None, RECENT_JOBS, None, user.username, None)
    data = {
        "title": "TunePlane",
        "jobs": [job_json(r) for r in rows],
        "fleets": _fleets(),
        # Running jobs of the user warned for idle GPUs, with their deadlines (sql/functions/idle.sql).
        "idle_warnings": db.call(fn.idle_warnings_of, user.id),
    }
    return respond("home.html", data)
