"""The Flask app factory: HTML console and HTTP forms that are also the API (one set of endpoints)."""

from __future__ import annotations

import logging
import secrets

import psycopg
from flask import Flask, render_template, request
from werkzeug.exceptions import HTTPException

from tuneplane.app import db_functions as fn
from tuneplane.app import reconnect
from tuneplane.app.db import Database
from tuneplane.app.errors import Refusal, busy_refusal, describe_db_error, rolled_back
from tuneplane.app.resources import resource_dir
from tuneplane.app.web.negotiate import json_response, wants_json

log = logging.getLogger(__name__)

# Blueprints by area; each later area adds its module here.
BLUEPRINTS = [
    "tuneplane.app.web.health",
    "tuneplane.app.web.home",
    "tuneplane.app.web.plugins_page",
    "tuneplane.app.web.fleet",
    "tuneplane.app.web.artifacts",
    "tuneplane.app.web.login",
    "tuneplane.app.web.tokens",
    "tuneplane.app.web.submit",
    "tuneplane.app.web.jobs",
    "tuneplane.app.web.jobs_launch",
    "tuneplane.app.web.telemetry_charts",
    "tuneplane.app.web.usage",
    "tuneplane.app.web.teams",
]

# Top navigation: (endpoint, label); entries whose blueprint is not registered are left out.
NAV = [
    ("jobs.jobs_list", "Jobs"),
    ("submit.dialog", "Submit"),
    ("fleet.fleet_page", "Fleets"),
    ("teams.teams_list", "Teams"),
    ("usage.usage_page", "Usage"),
    ("tokens.tokens_page", "API tokens"),
]


def create_app(database_url: str, *, pool_max: int = 8, config: dict | None = None) -> Flask:
    app = Flask(
        __name__,
        template_folder=str(resource_dir("templates")),
        static_folder=str(resource_dir("static")),
        static_url_path="/static",
    )
    app.config.update(
        SESSION_COOKIE_HTTPONLY=True,
        SESSION_COOKIE_SAMESITE="Lax",
        MAX_CONTENT_LENGTH=1024 * 1024 * 1024,
    )
    app.config.update(config or {})
    db = Database(database_url, max_size=pool_max, name="tuneplane-server")
    app.extensions["tuneplane_db"] = db
    if not app.config.get("SECRET_KEY"):
        app.config["SECRET_KEY"] = _shared_secret(db)

    from htmx_flask import Htmx

    Htmx(app)
    # Before any blueprint: the bounded int converter applies to routes as they are added, and the
    # limits check runs before every other before_request function (CSRF, authentication).
    from tuneplane.app.web import limits

    limits.install(app)

    import importlib

    for module_name in BLUEPRINTS:
        module = importlib.import_module(module_name)
        app.register_blueprint(module.bp)
        init = getattr(module, "init_app", None)
        if init is not None:
            init(app)

    from tuneplane.app import humanize
    from tuneplane.app.web.auth import current_user, forget_request_token, load_current_user

    app.jinja_env.filters.update(
        size=humanize.size, ago=humanize.ago, duration=humanize.duration, utc_minute=humanize.utc_minute
    )

    app.before_request(load_current_user)
    app.teardown_request(forget_request_token)
    app.context_processor(lambda: {"current_user": current_user()})
    app.context_processor(
        lambda: {"nav_links": [(end, label) for end, label in NAV if end in app.view_functions]}
    )
    _register_error_handlers(app)
    return app


def _shared_secret(db: Database) -> str:
    try:
        rows = db.call(fn.server_secret, "session_key", secrets.token_hex(32))
        return rows[0]["server_secret"]
    except psycopg.Error:
        # The database is down at start: serve /healthz (503) with a process-local key until it is back.
        log.warning("database unavailable at start; using a temporary session key")
        return secrets.token_hex(32)


def _error(status: int, message: str, fields: dict | None = None):
    # Through Refusal, which bounds every echo (app.errors.clip) whatever raised the error.
    body = Refusal(message, status, fields=dict(fields or {})).as_json()
    if wants_json() or request.is_json:
        return json_response(body, status)
    return render_template("error.html", **body), status


def _database_away():
    """503 with Retry-After: the database is restarting or failing over; the CLI and agents wait that long."""
    answer = _error(503, "the database is unavailable; try again shortly")
    retry_after = {"Retry-After": str(reconnect.RETRY_AFTER_S)}
    if isinstance(answer, tuple):  # the HTML page and its status
        return (*answer, retry_after)
    answer.headers.update(retry_after)
    return answer


def _register_error_handlers(app: Flask) -> None:
    @app.errorhandler(Refusal)
    def _refusal(exc: Refusal):
        return _error(exc.status, exc.message, exc.fields)

    @app.errorhandler(HTTPException)
    def _http(exc: HTTPException):
        if exc.code == 413:
            return _error(413, "the request body is larger than this endpoint accepts", {"body": "too large"})
        return _error(exc.code or 500, exc.description or exc.name)

    @app.errorhandler(psycopg.DataError)
    def _bad_value(exc: psycopg.DataError):
        # A safety net behind the limits layer (app/web/limits.py): a value PostgreSQL cannot take is the
        # client's, not a server fault. Logged so that a gap in the layer is seen and closed.
        column = getattr(exc.diag, "column_name", None) or "input"
        log.warning("a request value was refused by PostgreSQL (%s): %s", column, str(exc).splitlines()[0])
        message = f"a value in the request is out of range or malformed ({column})"
        return _error(400, message, {column: "invalid"})

    @app.errorhandler(psycopg.OperationalError)
    def _db_down(exc: psycopg.OperationalError):
        if rolled_back(exc):
            # A deadlock victim or serialization failure of a call made without retry: the database is
            # fine and nothing of the call happened. Callers that may meet one use call_retrying.
            log.warning("a request's transaction was rolled back: %s", describe_db_error(exc))
            refusal = busy_refusal(request.endpoint or request.path, exc, 1)
            return _error(refusal.status, refusal.message)
        log.error("database unavailable: %s", exc)
        return _database_away()

    @app.errorhandler(psycopg.errors.ReadOnlySqlTransaction)
    def _db_read_only(exc: psycopg.Error):
        # A failover in progress: the connection reached a standby (reconnect.discard_if_stale replaced it).
        log.error("database is read-only (a failover in progress?): %s", describe_db_error(exc))
        return _database_away()

    @app.errorhandler(Exception)
    def _unexpected(exc: Exception):
        log.exception("unhandled error")
        return _error(500, "internal error; the server log has the details")
