"""Who is asking: an API token (`Authorization: Bearer …`, for the CLI) or the console's session cookie.

The token's validity and scope are decided by the stored function `authenticate_api_token`.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import wraps
from typing import Any

from flask import current_app, g, redirect, request, session, url_for

from tuneplane.app import db_functions as fn
from tuneplane.app.db import request_token_id
from tuneplane.app.errors import Refusal
from tuneplane.app.security import token_hash
from tuneplane.app.web.negotiate import wants_json
from tuneplane.app.web.state import get_db


@dataclass(frozen=True)
class CurrentUser:
    id: int
    username: str
    role: str
    via: str  # token | session

    @property
    def is_admin(self) -> bool:
        """For what a page shows (an admin's buttons); what a request may do is decided in SQL."""
        return self.role == "admin"


def load_current_user() -> None:
    g.user = None
    # A worker thread serves many requests: the previous request's token must never carry over.
    request_token_id.set(None)
    header = request.headers.get("Authorization", "")
    if header.startswith("Bearer "):
        rows = get_db().call(fn.authenticate_api_token, token_hash(header[7:].strip()), "api")
        row = rows[0]
        g.user = CurrentUser(row["user_id"], row["username"], row["role"], "token")
        # Every database call of this request now acts under the token's scope (app/db.py).
        request_token_id.set(row["token_id"])
        return
    user_id = session.get("user_id")
    if user_id is not None:
        row = get_db().fetch_one(
            "SELECT id, username, role FROM users WHERE id = %s AND disabled_at IS NULL", (user_id,)
        )
        if row is None:
            session.clear()
            return
        g.user = CurrentUser(row["id"], row["username"], row["role"], "session")


def forget_request_token(_exc: BaseException | None = None) -> None:
    """After each request: the token's scope must not outlive it in this thread (code that runs after a
    request in the same thread — a test's own database calls after a test-client request — would act under
    it, and under a token id of another database)."""
    request_token_id.set(None)


def current_user() -> CurrentUser | None:
    return g.get("user")


def login_required(view: Any) -> Any:
    @wraps(view)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if current_user() is None:
            if wants_json() or request.headers.get("Authorization"):
                raise Refusal("authentication required: log in or send an API token", status=401)
            if "auth.login" in current_app.view_functions:
                return redirect(url_for("auth.login", next=request.full_path))
            raise Refusal("authentication required: log in first", status=401)
        return view(*args, **kwargs)

    return wrapper


def admin_required(view: Any) -> Any:
    @wraps(view)
    @login_required
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        # The rule is written once, in SQL (require_admin, sql/functions/access.sql): an enabled admin.
        # It refuses 403 "this needs the admin role" naming the field `actor`.
        get_db().call(fn.require_admin, current_user().id, "this")
        return view(*args, **kwargs)

    return wrapper
