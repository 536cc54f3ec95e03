"""CSRF protection for every state-changing request made with the console's session cookie.

A random token lives in the session; each form carries it as `csrf_token`, and htmx sends it as the
`X-CSRF-Token` header (base.html sets `hx-headers` from the `csrf_token` template global). Requests
authenticated by a Bearer API token are exempt: a browser never attaches one on its own, so a forged
cross-site request cannot carry it. Views that take credentials themselves (token issue for
`tuneplane login`) are marked with `csrf_exempt` and accept JSON only, which a cross-site form cannot send.
"""

from __future__ import annotations

import hmac
import secrets
from typing import Any

from flask import Flask, current_app, request, session

from tuneplane.app.errors import Refusal

SESSION_KEY = "csrf_token"
HEADER = "X-CSRF-Token"
FORM_FIELD = "csrf_token"
SAFE_METHODS = {"GET", "HEAD", "OPTIONS", "TRACE"}


def csrf_token() -> str:
    token = session.get(SESSION_KEY)
    if not token:
        token = secrets.token_urlsafe(32)
        session[SESSION_KEY] = token
    return token


def rotate_csrf_token() -> str:
    session[SESSION_KEY] = secrets.token_urlsafe(32)
    return session[SESSION_KEY]


def csrf_exempt(view: Any) -> Any:
    view.csrf_exempt = True
    return view


def check_csrf() -> None:
    if request.method in SAFE_METHODS:
        return
    if request.headers.get("Authorization", "").startswith("Bearer "):
        return
    view = current_app.view_functions.get(request.endpoint or "")
    if view is None or getattr(view, "csrf_exempt", False):
        return
    sent = request.headers.get(HEADER) or ""
    if not sent and request.mimetype in ("application/x-www-form-urlencoded", "multipart/form-data"):
        sent = request.form.get(FORM_FIELD, "")
    expected = session.get(SESSION_KEY) or ""
    # Compared as bytes: compare_digest refuses str with non-ASCII characters (a TypeError, not a 403).
    if not expected or not sent or not hmac.compare_digest(str(sent).encode(), str(expected).encode()):
        raise Refusal(
            "the form's CSRF token is missing or wrong; reload the page and try again",
            status=403,
            field="csrf_token",
        )


def init_csrf(app: Flask) -> None:
    if app.extensions.get("tuneplane_csrf"):
        return
    app.extensions["tuneplane_csrf"] = True
    app.jinja_env.globals["csrf_token"] = csrf_token
    app.before_request(check_csrf)
