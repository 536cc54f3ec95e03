"""Console login/logout (session cookie) and API tokens for the CLI (`tuneplane login`).

GET  /login          the login form
POST /login          username, password, csrf_token → session cookie, redirect to `next`
POST /logout         ends the session
POST /api/tokens     JSON {username, password, name?} → 201 {token, token_id, username, role}
"""

from __future__ import annotations

from urllib.parse import urlsplit

from flask import Blueprint, Flask, redirect, render_template, request, session, url_for

from tuneplane.app import db_functions as fn
from tuneplane.app.errors import Refusal
from tuneplane.app.security import hash_password, new_token, verify_password
from tuneplane.app.web.csrf import csrf_exempt, init_csrf, rotate_csrf_token
from tuneplane.app.web.limits import refuse_unknown
from tuneplane.app.web.negotiate import json_response, wants_json
from tuneplane.app.web.state import get_db

bp = Blueprint("auth", __name__)

# Compared against when the username is unknown, so a wrong name costs as long as a wrong password.
_DUMMY_HASH = hash_password("tuneplane-dummy-password")


def init_app(app: Flask) -> None:
    init_csrf(app)


def _check_credentials(username: str, password: str) -> dict:
    row = get_db().fetch_one(
        "SELECT id, username, role, password_hash FROM users WHERE username = %s AND disabled_at IS NULL",
        (username,),
    )
    stored = row["password_hash"] if row and row["password_hash"] else _DUMMY_HASH
    if not verify_password(password, stored) or row is None or not row["password_hash"]:
        raise Refusal("wrong username or password", status=401, field="password")
    return row


def _safe_next(target: str | None) -> str:
    """Only a path on this site; never another host (open redirect)."""
    if not target:
        return url_for("home.index")
    # Control characters (CR/LF would split the Location header) and backslashes (browsers read a path
    # starting with slash-backslash as `//host`) never appear in a path of ours.
    if any(ord(c) < 32 or ord(c) == 127 or c == "\\" for c in target):
        return url_for("home.index")
    parts = urlsplit(target)
    if parts.scheme or parts.netloc or not target.startswith("/") or target.startswith("//"):
        return url_for("home.index")
    return target


@bp.get("/login")
def login():
    return render_template("login.html", title="Log in", next=request.args.get("next", ""), error=None)


@bp.post("/login")
def login_submit():
    username = request.form.get("username", "").strip()
    password = request.form.get("password", "")
    try:
        user = _check_credentials(username, password)
    except Refusal as refusal:
        if wants_json():
            raise
        page = render_template(
            "login.html",
            title="Log in",
            next=request.form.get("next", ""),
            error=refusal.message,
            username=username,
        )
        return page, refusal.status
    session.clear()
    session["user_id"] = user["id"]
    rotate_csrf_token()
    if wants_json():
        return json_response({"username": user["username"], "role": user["role"]})
    return redirect(_safe_next(request.form.get("next")), code=303)


@bp.post("/logout")
def logout():
    session.clear()
    if wants_json():
        return json_response({"logged_out": True})
    return redirect(url_for("auth.login"), code=303)


@bp.post("/api/tokens")
@csrf_exempt
def issue_token():
    """Always JSON: this endpoint exists for the CLI."""
    try:
        return _issue_token()
    except Refusal as refusal:
        return json_response(refusal.as_json(), refusal.status)


def _issue_token():
    if not request.is_json:
        raise Refusal('send JSON: {"username": …, "password": …}', status=415, field="body")
    body = request.get_json(silent=True)
    if not isinstance(body, dict):
        raise Refusal("the body must be a JSON object", status=400, field="body")
    refuse_unknown(body, ("username", "password", "name"))
    username, password = body.get("username"), body.get("password")
    if not isinstance(username, str) or not username:
        raise Refusal("username is required", status=400, field="username")
    if not isinstance(password, str) or not password:
        raise Refusal("password is required", status=400, field="password")
    name = body.get("name") or "tuneplane login"
    if not isinstance(name, str):
        raise Refusal("name must be text", status=400, field="name")
    user = _check_credentials(username, password)
    plaintext, digest = new_token("tpu")
    token = get_db().call(fn.issue_api_token, user["id"], name[:100], digest, None)[0]
    return json_response(
        {"token": plaintext, "token_id": token["id"], "username": user["username"], "role": user["role"]}, 201
    )
