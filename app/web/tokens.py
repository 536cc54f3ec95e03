"""API tokens of the logged-in user (docs/teams.md, scoped tokens).

GET  /tokens               the user's tokens: scope (teams, read-only), created, last use, state (HTML/JSON)
POST /tokens               make a token: name, teams (names), read_only, ttl → shown once (201)
POST /tokens/<id>/revoke   revoke one of the user's tokens

Scope rules (a token never makes a wider one; read-only tokens change nothing) live in the stored
functions issue_scoped_api_token and revoke_api_token. A `ttl` is a duration between 1 minute and the
installation's maximum (`TUNEPLANE_API_TOKEN_MAX_TTL`, default 365 days); absent, the token has no
expiry; blank, `0`, `7 d` or `７d` are refused (app/durations.py). A name carries no control character.
"""

from __future__ import annotations

import datetime as dt
import os
from typing import Any

from flask import Blueprint, current_app, redirect, request, url_for
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from tuneplane.app import db_functions as fn
from tuneplane.app.durations import MINUTE, parse_duration
from tuneplane.app.errors import Refusal
from tuneplane.app.security import new_token
from tuneplane.app.web.auth import current_user, login_required
from tuneplane.app.web.limits import body_dict, refusal_from_errors
from tuneplane.app.web.negotiate import json_response, respond, wants_json
from tuneplane.app.web.state import get_db

bp = Blueprint("tokens", __name__)

MAX_TTL = dt.timedelta(days=365)
ENV_MAX_TTL = "TUNEPLANE_API_TOKEN_MAX_TTL"


class TokenCreate(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid", str_strip_whitespace=True)
    name: str = Field("api", min_length=1, max_length=100, pattern=r"^[^\x00-\x1f\x7f-\x9f]*$")
    teams: list[str] = Field(default_factory=list, max_length=100)
    read_only: bool = False
    ttl: str | None = Field(None, max_length=40)


def _body() -> TokenCreate:
    if request.is_json:
        raw: Any = request.get_json(silent=True)
        if not isinstance(raw, dict):
            raise Refusal("the body must be a JSON object", status=400, field="body")
    else:
        form = request.form
        raw = {
            "name": form.get("name") or "api",
            "teams": [t.strip() for t in form.get("teams", "").replace(",", " ").split() if t.strip()],
            "read_only": bool(form.get("read_only")),
            "ttl": form.get("ttl") or None,  # the form's empty field: no expiry
        }
    try:
        return TokenCreate.model_validate(raw)
    except ValidationError as exc:
        raise refusal_from_errors(exc) from None


def _max_ttl() -> dt.timedelta:
    # The operator's setting: the console's config, or the environment `tuneplane up`/`server` runs in.
    configured = current_app.config.get("TP_API_TOKEN_MAX_TTL") or os.environ.get(ENV_MAX_TTL)
    if not configured:
        return MAX_TTL
    return parse_duration(configured, "TP_API_TOKEN_MAX_TTL", MINUTE, dt.timedelta(days=3650))


@bp.get("/tokens")
@login_required
def tokens_page():
    rows = get_db().call(fn.tokens_of, current_user().id)
    return respond("tokens.html", {"title": "API tokens", "tokens": rows, "created": None}, json_data=rows)


@bp.post("/tokens")
@login_required
def create_token():
    body = _body()
    ttl = None if body.ttl is None else parse_duration(body.ttl, "ttl", MINUTE, _max_ttl())
    plaintext, digest = new_token("tpu")
    row = get_db().call(
        fn.issue_scoped_api_token, current_user().id, body.name, digest, ttl, body.teams, body.read_only
    )[0]
    created = {
        "token": plaintext,
        "token_id": row["id"],
        "name": row["name"],
        "teams": body.teams,
        "read_only": row["read_only"],
        "expires_at": row["expires_at"],
    }
    if wants_json() or request.is_json:
        return json_response(created, 201)
    rows = get_db().call(fn.tokens_of, current_user().id)
    return respond("tokens.html", {"title": "API tokens", "tokens": rows, "created": created}, 201)


@bp.post("/tokens/<int:token_id>/revoke")
@login_required
def revoke_token(token_id: int):
    body_dict(())  # takes no fields
    get_db().call(fn.revoke_api_token, current_user().id, token_id)
    if wants_json() or request.is_json:
        return json_response({"token_id": token_id, "revoked": True})
    return redirect(url_for("tokens.tokens_page"), code=303)
