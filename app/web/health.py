"""`GET /healthz`: 200 `{"status": "ok"}` when the database answers, 503 `{"status": "unavailable"}` when
it does not; unauthenticated, so it says that and nothing else (no version, host or counters)."""

from __future__ import annotations

from flask import Blueprint

from tuneplane.app.web.negotiate import json_response
from tuneplane.app.web.state import get_db

bp = Blueprint("health", __name__)


@bp.get("/healthz")
def healthz():
    ok = get_db().ping()
    body = {"status": "ok" if ok else "unavailable"}
    return json_response(body, 200 if ok else 503)
