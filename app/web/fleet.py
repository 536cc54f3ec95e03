"""The Fleet page and the fleet/node HTTP API (the CLI's `tuneplane fleet …` uses the same endpoints).

Reads come from the operator views v_fleet, v_nodes and v_node_events; every change is one stored
function (create_fleet, create_enrollment_token, change_node_scheduling, set_fleet_access_mode,
set_fleet_team_access) with the user as the actor.

GET  /fleets/<name>/access        who may use the fleet: its mode (open|listed) and its team grants
POST /fleets/<name>/access        mode=open|listed (installation admins; `tuneplane fleet access`)
POST /fleets/<name>/team-access   team, action=grant|revoke, slurm_account (installation admins;
                                  `tuneplane teams grant|revoke`)
"""

from __future__ import annotations

import datetime as dt

from flask import Blueprint, current_app, flash, redirect, render_template, request, url_for
from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator

from tuneplane.app import db_functions as fn
from tuneplane.app.durations import MINUTE, parse_duration
from tuneplane.app.errors import Refusal
from tuneplane.app.input_limits import check_text
from tuneplane.app.node_gateway.config import gateway_url
from tuneplane.app.node_gateway.protocol import ENROLL_TOKEN_PREFIX
from tuneplane.app.plugins import load_plugins
from tuneplane.app.security import new_token
from tuneplane.app.web.auth import admin_required, current_user, login_required
from tuneplane.app.web.limits import from_form, parse_body
from tuneplane.app.web.negotiate import json_response, respond, wants_json
from tuneplane.app.web.state import get_db

bp = Blueprint("fleet", __name__)

SCHEDULING_ACTIONS = ("cordon", "drain", "uncordon", "retire")
# The buttons the console offers per scheduling state (retire stays a deliberate CLI/psql act).
BUTTONS = {
    "active": ["cordon", "drain"],
    "cordoned": ["drain", "uncordon"],
    "draining": ["cordon", "uncordon"],
    "retired": [],
}
STATE_DIR_HINT = "/var/lib/tuneplane/node"
MAX_TTL = dt.timedelta(days=30)


def parse_ttl(raw: str | None) -> dt.timedelta:
    """An enrollment token's `ttl` (`15m`, `1h`, `7d`; absent: 1h) between 1 minute and 30 days (400, ttl)."""
    return parse_duration("1h" if raw is None else raw, "ttl", MINUTE, MAX_TTL)


class _Body(BaseModel):
    # Strict: a number where a name belongs is refused, not turned into "5". Form posts carry the CSRF
    # token and the page's fleet beside the fields; JSON clients send only the fields.
    model_config = ConfigDict(strict=True, extra="ignore", str_strip_whitespace=True)


class FleetCreate(_Body):
    name: str = Field("", max_length=200)
    backend: str = Field("node", max_length=200)
    capabilities: dict = Field(default_factory=dict)
    # Where the fleet's artifact bytes live (docs/artifacts.md "Object storage"): "filesystem" or
    # "s3://bucket/prefix" with the s3_* fields; never credentials (the server's, app/s3store.py).
    storage: str | None = Field(None, max_length=1100)
    s3_endpoint: str | None = Field(None, max_length=1000)
    s3_region: str = Field("us-east-1", max_length=64)
    s3_addressing_style: str = Field("path", max_length=16)


def _storage(body: FleetCreate) -> dict | None:
    """The fleet's storage row from the request, checked field by field (400 naming the field)."""
    from tuneplane.app.s3store import S3ConfigError, S3Location

    if body.storage in (None, "", "filesystem"):
        if body.s3_endpoint:
            raise Refusal("--s3-endpoint needs an s3:// storage", status=400, field="s3_endpoint")
        return None
    try:
        location = S3Location.parse(
            body.storage,
            endpoint=body.s3_endpoint or None,
            region=body.s3_region,
            addressing_style=body.s3_addressing_style,
        )
    except S3ConfigError as exc:
        field, _, _ = str(exc).partition(":")
        field = {"storage": "storage", "bucket": "storage", "prefix": "storage"}.get(field, f"s3_{field}")
        raise Refusal(str(exc), status=400, field=field) from exc
    return {
        "kind": "s3",
        "bucket": location.bucket,
        "prefix": location.prefix,
        "endpoint": location.endpoint,
        "region": location.region,
        "addressing_style": location.addressing_style,
    }


class AccessMode(_Body):
    mode: str = Field("", max_length=20)


class TeamAccess(_Body):
    team: str = Field(max_length=200)
    action: str = Field("grant", max_length=20)
    slurm_account: str | None = Field(None, max_length=200)


class TokenCreate(_Body):
    ttl: str | None = Field(None, max_length=40)


class IdlePolicyForm(BaseModel):
    # Not strict in itself: a form posts text; parse_body holds a JSON body to the types strictly.
    model_config = ConfigDict(extra="ignore", str_strip_whitespace=True)
    team: str | None = Field(None, max_length=200)
    idle_after: str | None = Field(None, max_length=40)
    utilization_below: float | None = None
    power_below: float | None = None
    action: str | None = Field(None, max_length=20)
    idle_grace: str | None = Field(None, max_length=40)

    @field_validator("*", mode="before")
    @classmethod
    def _empty_is_unchanged(cls, value: object, info: ValidationInfo) -> object:
        return None if value == "" and from_form(info) else value


IDLE_LIMIT = dt.timedelta(days=30)


class NodeAction(_Body):
    node: str = Field("", max_length=200)
    action: str = Field("", max_length=50)
    reason: str | None = Field(None, max_length=500)
    fleet: str | None = Field(None, max_length=200)

    @field_validator("node", mode="before")
    @classmethod
    def _node_id(cls, value: object) -> object:
        # A node id may come as a JSON number; a boolean is not one.
        return str(value) if isinstance(value, int) and not isinstance(value, bool) else value


def init_app(app) -> None:
    @app.template_filter("gib")
    def _gib(value: int | None) -> str:
        return f"{(value or 0) / 1024**3:.1f} GiB"


def _actor() -> str:
    user = current_user()
    return f"user:{user.username}" if user else "anonymous"


def _fleets(name: str | None = None) -> list[dict]:
    db = get_db()
    if name is None:
        fleets = db.fetch_all("SELECT * FROM v_fleet ORDER BY fleet")
        nodes = db.fetch_all("SELECT * FROM v_nodes ORDER BY fleet, node")
    else:
        fleets = db.fetch_all("SELECT * FROM v_fleet WHERE fleet = %s", (name,))
        if not fleets:
            raise Refusal(f"no fleet named {name}", status=404, field="fleet")
        nodes = db.fetch_all("SELECT * FROM v_nodes WHERE fleet = %s ORDER BY node", (name,))
    # Each GPU with the member holding it, its last samples and the idle sweep's verdict (idle.sql).
    gpus = db.call(fn.fleet_gpus, name)
    by_node: dict[int, list[dict]] = {}
    for gpu in gpus:
        by_node.setdefault(gpu.pop("node_id"), []).append(gpu)
    by_fleet: dict[str, list[dict]] = {}
    for node in nodes:
        node["gpu_list"] = by_node.get(node["node_id"], [])
        node["actions"] = BUTTONS.get(node["scheduling_state"], [])
        by_fleet.setdefault(node["fleet"], []).append(node)
    for fleet in fleets:
        fleet["node_list"] = by_fleet.get(fleet["fleet"], [])
    _slurm_view(db, fleets)
    return fleets


def _slurm_view(db, fleets: list[dict]) -> None:
    """Slurm fleets (docs/slurm.md): Slurm's own node state (idle, alloc, mix, drain, down …) is the
    scheduling state and whether the controller answered the worker's last look is the connectivity;
    nodes are drained and resumed in Slurm, so no TunePlane scheduling or fence buttons."""
    slurm = [f for f in fleets if f["backend"] == "slurm"]
    if not slurm:
        return
    ids = [f["fleet_id"] for f in slurm]
    status = {
        row["fleet_id"]: row
        for row in db.fetch_all(
            "SELECT fleet_id, partition, account, qos, version, reachable, last_error, checked_at, max_nodes,"
            " max_time_minutes FROM slurm_fleets WHERE fleet_id = ANY(%s)",
            (ids,),
        )
    }
    states = {
        row["node_id"]: row
        for row in db.fetch_all(
            "SELECT s.node_id, s.slurm_state, s.reason FROM slurm_nodes s JOIN nodes n ON n.id = s.node_id"
            " WHERE n.fleet_id = ANY(%s)",
            (ids,),
        )
    }
    for fleet in slurm:
        fleet["slurm"] = status.get(fleet["fleet_id"])
        reachable = bool(fleet["slurm"] and fleet["slurm"]["reachable"])
        for node in fleet["node_list"]:
            state = states.get(node["node_id"])
            node["scheduling_state"] = state["slurm_state"] if state else "unknown"
            node["slurm_reason"] = state["reason"] if state else None
            node["connectivity"] = "controller reachable" if reachable else "controller unreachable"
            node["actions"] = []


def _events(name: str | None, limit: int = 30) -> list[dict]:
    where, params = ("WHERE fleet = %s", (name, limit)) if name else ("", (limit,))
    return get_db().fetch_all(f"SELECT * FROM v_node_events {where} ORDER BY id DESC LIMIT %s", params)


def _render(name: str | None, status: int = 200):
    if name is None and not wants_json():
        # The overview (/fleets): one row per fleet (v_fleet: nodes connected of total, GPUs free of total,
        # jobs running and waiting), each linking to its fleet's page, which has the nodes and team shares.
        fleets = get_db().fetch_all("SELECT * FROM v_fleet ORDER BY fleet")
    else:
        fleets = _fleets(name)
        for fleet in fleets:  # each team's share of the fleet now (team_reads.sql)
            fleet["team_shares"] = get_db().call(fn.fleet_team_share_of, fleet["fleet"])
    events = _events(name)
    # Jobs asked to checkpoint and stop that still run (docs/preemption.md).
    where, params = ("WHERE fleet = %s", (name,)) if name is not None else ("", ())
    in_grace = get_db().fetch_all(f"SELECT * FROM v_in_grace {where} ORDER BY grace_deadline", params)
    data = {
        "fleets": fleets,
        "events": events,
        "in_grace": in_grace,
        "fleet_name": name,
        "gateway_url": _gateway_url(),
        "actions": SCHEDULING_ACTIONS,
        "idle_policies": get_db().call(fn.idle_policies_of, name) if name is not None else None,
        "access": _access(name) if name is not None else None,
    }
    if wants_json():
        if name is not None:
            return json_response({"fleet": fleets[0], "events": events, "in_grace": in_grace}, status)
        return json_response({"fleets": fleets, "in_grace": in_grace}, status)
    if request.headers.get("HX-Request") and request.headers.get("HX-Target") == "fleet-live":
        return render_template("_fleet_live.html", **data), status
    return render_template("fleet.html", title=f"Fleet {name}" if name else "Fleets", **data), status


def _gateway_url() -> str:
    return current_app.config.get("TP_NODE_GATEWAY_URL") or gateway_url() or "https://NODE-GATEWAY-HOST:8081"


@bp.get("/fleets")
@login_required
def fleet_page():
    return _render(None)


@bp.get("/fleets/<name>")
@login_required
def fleet_show(name: str):
    return _render(name)


@bp.post("/fleets")
@admin_required
def fleet_create():
    body = parse_body(FleetCreate)
    backend = body.backend or "node"
    known = {item.plugin.name for item in load_plugins().get("backends", []) if item.plugin}
    if backend not in known:
        raise Refusal(
            f"unknown backend {backend!r}; installed: {', '.join(sorted(known)) or 'none'}",
            status=400,
            field="backend",
        )
    storage = _storage(body)
    user = current_user()
    db = get_db()
    # One transaction: a storage set_fleet_storage refuses leaves no fleet behind (a 400, not a fleet
    # created on the default store that the retry then finds taken).
    with db.transaction():
        created_by = user.id if user else None
        row = db.call(fn.create_fleet, body.name, backend, _jsonb(body.capabilities), created_by)[0]
        if storage is not None:
            row = db.call(fn.set_fleet_storage, body.name, _jsonb(storage), _actor())[0]
    if wants_json():
        return json_response(row, 201)
    return _render(None, 201)


def _jsonb(value: dict):
    from psycopg.types.json import Jsonb

    return Jsonb(value)


@bp.post("/fleets/<name>/enrollment-tokens")
@admin_required
def enrollment_token_create(name: str):
    ttl = parse_ttl(parse_body(TokenCreate).ttl)
    plaintext, digest = new_token(ENROLL_TOKEN_PREFIX)
    row = get_db().call(fn.create_enrollment_token, name, digest, ttl, _actor())[0]
    url = _gateway_url()
    data = {
        "fleet": row["fleet"],
        "token": plaintext,
        "token_id": row["token_id"],
        "expires_at": row["expires_at"],
        "gateway_url": url,
        "command": f"tuneplane node --server {url} --enroll-token {plaintext} --state-dir {STATE_DIR_HINT}",
    }
    return respond("_enrollment_token.html", data, 201)


@bp.post("/nodes/fence")
@admin_required
def node_fence():
    """Declare a node dead (fence: its members become lost, their resources are released) or undo it."""
    body = parse_body(NodeAction)
    action = body.action or "fence"
    if action not in ("fence", "unfence"):
        raise Refusal("action must be fence or unfence", status=400, field="action")
    node, reason = _node_and_reason(body)
    db = get_db()
    if action == "fence":
        # A deadlock victim is run again here (bounded, logged), never answered as "database unavailable".
        row = db.call_retrying(fn.fence_node, node, reason, _actor())[0]
    else:
        node_id = db.fetch_one(f"SELECT {fn.resolve_node}(%s) AS id", (node,))["id"]
        changed = db.call_retrying(fn.unfence_node, node, reason, _actor())[0]["unfence_node"]
        row = {"node_id": node_id, "unfenced": changed}
    if wants_json():
        return json_response(row)
    return _render(body.fleet or None)


def _node_and_reason(body: NodeAction) -> tuple[str, str | None]:
    node = str(body.node).strip()
    if not node:
        raise Refusal("which node? give its id, FLEET/NAME or a unique name", status=400, field="node")
    # The console's buttons ask for the reason with hx-prompt, which arrives as a header.
    reason = body.reason or request.headers.get("HX-Prompt") or None
    if reason is not None:
        check_text(reason, "reason", 500)
    return node, reason


@bp.post("/nodes/scheduling")
@admin_required
def node_scheduling():
    body = parse_body(NodeAction)
    action = body.action
    if action not in SCHEDULING_ACTIONS:
        raise Refusal(f"action must be one of {', '.join(SCHEDULING_ACTIONS)}", status=400, field="action")
    node, reason = _node_and_reason(body)
    row = get_db().call_retrying(fn.change_node_scheduling, node, action, reason, _actor())[0]
    if wants_json():
        return json_response(row)
    # The console's buttons swap the live part of the page.
    return _render(body.fleet or None)


@bp.get("/fleets/<name>/idle-policy")
@login_required
def idle_policy_show(name: str):
    """The fleet's idle policy and each team's override, as set and as they apply (docs/idle.md)."""
    return json_response({"fleet": name, "policies": get_db().call(fn.idle_policies_of, name)})


@bp.post("/fleets/<name>/idle-policy")
@login_required
def idle_policy_set(name: str):
    """An installation admin sets the fleet's idle policy, or one team's override (`team`); a field left out
    stays as it was (set_idle_policy refuses a non-admin, unknown fleet or team, a value out of range)."""
    body = parse_body(IdlePolicyForm)
    db = get_db()
    team_id = None
    if body.team:
        team = db.fetch_one("SELECT id FROM teams WHERE name = %s", (body.team,))
        if team is None:
            raise Refusal(f"no team {body.team}", status=404, field="team")
        team_id = team["id"]
    idle_after = (
        None if body.idle_after is None else parse_duration(body.idle_after, "idle_after", MINUTE, IDLE_LIMIT)
    )
    grace = (
        None
        if body.idle_grace is None
        else parse_duration(body.idle_grace, "idle_grace", dt.timedelta(0), IDLE_LIMIT)
    )
    row = db.call(
        fn.set_idle_policy, current_user().id, name, team_id, idle_after, body.utilization_below,
        body.power_below, body.action, grace,
    )[0]  # fmt: skip
    if wants_json():
        return json_response({"fleet": name, "team": body.team, "policy": row})
    flash(f"idle policy of {name}{' for team ' + body.team if body.team else ''} set", "ok")
    return redirect(url_for("fleet.fleet_show", name=name), 303)


def _access(name: str) -> dict:
    """The fleet's mode and the grants the user may see (fleet_team_access_of, teams.sql)."""
    rows = get_db().call(fn.fleet_team_access_of, current_user().id, name, None)
    if not rows:
        raise Refusal(f"no fleet named {name}", status=404, field="fleet")
    grants = [
        {"team": r["team"], "slurm_account": r["slurm_account"], "granted_at": r["granted_at"]}
        for r in rows
        if r["team"] is not None
    ]
    return {"fleet": name, "team_access": rows[0]["team_access"], "teams": grants}


def _access_done(name: str, message: str):
    if wants_json():
        return json_response(_access(name))
    flash(message, "ok")
    return redirect(url_for("fleet.fleet_show", name=name), 303)


@bp.get("/fleets/<name>/access")
@login_required
def access_show(name: str):
    return json_response(_access(name))


@bp.post("/fleets/<name>/access")
@login_required
def access_mode(name: str):
    """Open the fleet to every team or only to the teams granted it (set_fleet_access_mode)."""
    body = parse_body(AccessMode)
    row = get_db().call(fn.set_fleet_access_mode, current_user().id, name, body.mode)[0]
    return _access_done(name, f"fleet {name}: {row['team_access']}")


@bp.post("/fleets/<name>/team-access")
@login_required
def team_access(name: str):
    """Grant a team the fleet (with its Slurm account) or revoke it (set_fleet_team_access)."""
    body = parse_body(TeamAccess)
    if body.action not in ("grant", "revoke"):
        raise Refusal("action must be grant or revoke", status=400, field="action")
    granted = body.action == "grant"
    get_db().call(fn.set_fleet_team_access, current_user().id, name, body.team, granted, body.slurm_account)
    return _access_done(name, f"team {body.team} {'granted' if granted else 'revoked'} on fleet {name}")
