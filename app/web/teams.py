"""Team pages (docs/teams.md "Console"): a user's teams, and one team's members and roles, quota against
GPUs in use and borrowed per fleet, queue, usage and (for its admins) webhooks.

GET  /teams                                   the teams I have a role in
POST /teams                                   name: a new shared team, its maker its admin
GET  /teams/<name>                            the team page (HTML or JSON)
POST /teams/<name>/members                    username, role (admin|member|viewer|remove): team admins
POST /teams/<name>/quotas                     fleet, gpu_model, guaranteed_gpus, limit_gpus, weight,
                                              overcommit: installation admins
POST /teams/<name>/priority                   max_class (empty: remove), fleet (empty: every fleet):
                                              installation admins (docs/teams.md "Priority classes")
POST /teams/<name>/webhooks                   url, secret (empty: generated, shown once), kinds: team admins
POST /teams/<name>/webhooks/<id>/remove       team admins

Every rule is in SQL (team_reads.sql, teams.sql, team_events.sql); a view reads the request, calls one
function and renders.
"""

from __future__ import annotations

import secrets
from datetime import UTC, datetime, timedelta

from flask import Blueprint, flash, redirect, request, url_for
from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator

from tuneplane.app import db_functions as fn
from tuneplane.app import usage_report, webhook_targets
from tuneplane.app.errors import Refusal
from tuneplane.app.web.auth import current_user, login_required
from tuneplane.app.web.limits import body_dict, from_form, parse_body
from tuneplane.app.web.negotiate import json_response, respond, wants_json
from tuneplane.app.web.state import get_db

bp = Blueprint("teams", __name__)

NAME = r"^[a-z0-9][a-z0-9_.-]{1,62}$"


class _Form(BaseModel):
    # Form posts carry every value as text (and the CSRF token beside them); JSON clients send numbers.
    model_config = ConfigDict(extra="ignore", str_strip_whitespace=True)


class TeamForm(_Form):
    name: str = Field(max_length=63)


class MemberForm(_Form):
    username: str = Field(max_length=63)
    role: str = Field(max_length=10)

    @field_validator("role")
    @classmethod
    def _role(cls, value: str) -> str:
        if value not in ("admin", "member", "viewer", "remove"):
            raise ValueError("role must be admin, member, viewer or remove")
        return value


class QuotaForm(_Form):
    fleet: str = Field(max_length=200)
    gpu_model: str = Field("", max_length=200)
    guaranteed_gpus: int | None = Field(None, ge=0, le=1_000_000)
    limit_gpus: int | None = Field(None, ge=0, le=1_000_000)
    weight: float = Field(1.0, gt=0, le=1_000_000)
    overcommit: bool = False

    # A form's empty field and its checkbox are text; a JSON client sends null and true/false.
    @field_validator("guaranteed_gpus", "limit_gpus", mode="before")
    @classmethod
    def _empty_is_none(cls, value: object, info: ValidationInfo) -> object:
        return None if value == "" and from_form(info) else value

    @field_validator("overcommit", mode="before")
    @classmethod
    def _checkbox(cls, value: object, info: ValidationInfo) -> object:
        return value in ("1", "on", "true") if isinstance(value, str) and from_form(info) else value


class PriorityForm(_Form):
    max_class: str = Field("", max_length=32)
    fleet: str = Field("", max_length=200)


class WebhookForm(_Form):
    url: str = Field(max_length=2000)
    secret: str = Field("", max_length=200)
    kinds: str | list[str] | None = Field(None, max_length=1000)


def _done(team: str, message: str, data: dict):
    if wants_json():
        return json_response(data)
    flash(message, "ok")
    return redirect(url_for("teams.team_page", name=team), 303)


@bp.get("/teams")
@login_required
def teams_list():
    teams = get_db().call(fn.teams_of, current_user().id)
    return respond("teams/list.html", {"teams": teams}, json_data={"teams": teams})


@bp.post("/teams")
@login_required
def team_create():
    form = parse_body(TeamForm)
    team = get_db().call(fn.create_team, current_user().id, form.name)[0]
    if wants_json():
        return json_response({"id": team["id"], "name": team["name"]}, 201)
    flash(f"team {team['name']} created; you are its admin", "ok")
    return redirect(url_for("teams.team_page", name=team["name"]), 303)


@bp.get("/teams/<name>")
@login_required
def team_page(name: str):
    db, actor = get_db(), current_user().id
    members = db.call(fn.team_members_of, actor, name)  # 404 for a team the actor cannot read
    my_role = next((m["role"] for m in members if m["user_id"] == actor), None)
    since = datetime.now(UTC) - timedelta(days=30)
    usage = usage_report.table(db.call(fn.usage_report, actor, "user", name, since, None), "user")
    data = {
        "team": name,
        "my_role": my_role,
        "members": members,
        "quotas": db.call(fn.team_quotas_of, actor, name),
        "queue": db.call(fn.team_queue_of, actor, name),
        "priority": db.call(fn.team_priority_grants_of, _team_id(db, actor, name)),
        # The listed fleets granted to the team, with their Slurm accounts (`tuneplane teams grant`).
        "fleet_access": [
            {k: r[k] for k in ("fleet", "team_access", "slurm_account", "granted_at")}
            for r in db.call(fn.fleet_team_access_of, actor, None, name)
        ],
        "usage": usage,
        "webhooks": None,
        "deliveries": None,
    }
    if my_role == "admin" or current_user().is_admin:
        data["webhooks"] = db.call(fn.team_webhooks_of, actor, name)
        data["deliveries"] = db.call(fn.team_event_deliveries_of, actor, name, 20)
    if not wants_json():
        data["fleets"] = [r["name"] for r in db.fetch_all("SELECT name FROM fleets ORDER BY name")]
        classes = db.fetch_all("SELECT name FROM priority_classes ORDER BY value")
        data["classes"] = [r["name"] for r in classes]
    return respond("teams/team.html", data)


@bp.post("/teams/<name>/members")
@login_required
def team_member(name: str):
    form = parse_body(MemberForm)
    role = None if form.role == "remove" else form.role
    get_db().call(fn.set_team_member_by_name, current_user().id, name, form.username, role)
    said = f"{form.username} removed" if role is None else f"{form.username} is now {role}"
    return _done(name, said, {"team": name, "username": form.username, "role": role})


@bp.post("/teams/<name>/quotas")
@login_required
def team_quota(name: str):
    form = parse_body(QuotaForm)
    db = get_db()
    team = db.call(fn.team_read_of, current_user().id, name)[0]
    fleet = db.fetch_one("SELECT id FROM fleets WHERE name = %s", (form.fleet,))
    if fleet is None:
        raise Refusal(f"no fleet {form.fleet}", status=404, field="fleet")
    row = db.call(
        fn.set_team_quota, current_user().id, team["id"], fleet["id"], form.gpu_model, form.guaranteed_gpus,
        form.limit_gpus, form.weight, form.overcommit,
    )[0]  # fmt: skip
    said = (
        f"quota on {form.fleet} removed"
        if form.guaranteed_gpus is None
        else f"quota on {form.fleet}: {form.guaranteed_gpus} guaranteed, limit {form.limit_gpus or 'none'}"
    )
    return _done(name, said, {"team": name, "quota": row})


def _team_id(db, actor: int, name: str) -> int:
    return db.call(fn.team_read_of, actor, name)[0]["id"]


@bp.post("/teams/<name>/priority")
@login_required
def team_priority(name: str):
    """The highest priority class the team's members may use (on one fleet or every fleet): installation
    admins (set_team_priority_grant); an empty class removes the grant."""
    form = parse_body(PriorityForm)
    grants = get_db().call(
        fn.set_team_priority_grant, current_user().id, name, form.fleet or None, form.max_class or None
    )
    where = f"on {form.fleet}" if form.fleet else "on every fleet"
    said = (
        f"{name} may use priority classes up to {form.max_class} {where}"
        if form.max_class
        else (f"{name}'s priority grant {where} removed")
    )
    return _done(name, said, {"team": name, "priority": grants})


def _webhook_kinds(form: WebhookForm) -> list[str] | None:
    """The kinds asked for: a JSON list as sent (`[]` is refused by create_team_webhook, not read as every
    kind), a form's text split on commas and spaces; absent, or a form's empty field: every kind."""
    if isinstance(form.kinds, list):
        return form.kinds
    if form.kinds is None:
        return None
    kinds = form.kinds.replace(",", " ").split()
    if not kinds and request.is_json:
        raise Refusal("kinds must be a non-empty list of event kinds", status=400, field="kinds")
    return kinds or None


@bp.post("/teams/<name>/webhooks")
@login_required
def team_webhook(name: str):
    form = parse_body(WebhookForm)
    try:
        webhook_targets.check_target(form.url, webhook_targets.current_policy())
    except webhook_targets.TargetRefused as exc:
        raise Refusal(f"url: {exc}", status=400, field="url") from None
    generated = not form.secret
    secret = form.secret or secrets.token_urlsafe(24)
    hook = get_db().call(
        fn.create_team_webhook, current_user().id, name, form.url, secret, _webhook_kinds(form)
    )[0]
    shown = {"id": hook["id"], "url": hook["url"], "kinds": hook["kinds"]}
    if not generated:  # the sender knows its own secret: it is never echoed
        return _done(name, f"webhook {hook['id']} added", shown)
    # A generated secret is shown this once (the receiver needs it to check signatures), never again.
    said = f"webhook {hook['id']} added; its secret (shown once): {secret}"
    return _done(name, said, {**shown, "secret": secret})


@bp.post("/teams/<name>/webhooks/<int:webhook_id>/remove")
@login_required
def team_webhook_remove(name: str, webhook_id: int):
    body_dict(())  # takes no fields
    get_db().call(fn.remove_team_webhook, current_user().id, name, webhook_id)
    return _done(name, f"webhook {webhook_id} removed", {"id": webhook_id, "removed": True})
