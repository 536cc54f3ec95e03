"""`GET /healthz`: 200 with JSON when the database answers, 503 when it does not."""

from __future__ import annotations

from flask import Blueprint

from tuneplane.app.web.negotiate import json_response
from tuneplane.app.web.state import get_db

bp = Blueprint("health", __name__)


@bp.get("/healthz")
def healthz():
    ok = get_db().ping()
    body = {"status": "ok" if ok else "unavailable", "database": "ok" if ok else "unreachable"}
    return json_response(body, 200 if ok else 503)
