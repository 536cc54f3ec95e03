"""Every registered route walked with hostile values (issue 38): the console's Flask URL map and both
gateways' aiohttp routers, as registered (a new route is walked without anyone listing it).

  - every integer path parameter (`<int:…>`, an id or index segment) gets each of WALK_VALUES;
  - every integer query parameter the input layer declares (input_limits.INT_PARAMS) gets each of them
    on every GET route;
  - every JSON body route gets its valid body (BODIES; `{}` where none is listed) plus an unknown field,
    and the valid body with each field replaced by a value of the wrong type.
It fails on any 5xx, and on any 2xx for a value outside the declared range (path: ids 1…2⁶³−1, indexes
0…2³¹−1; query: INT_PARAMS; a body with an unknown field or a wrong type is outside its model). Console
requests go through Flask's test client, gateway requests over real HTTP on loopback.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from aiohttp.test_utils import TestServer
from flask.testing import FlaskClient

from tests.launch_fixtures import make_job
from tests.node_helpers import make_token
from tests.submission_setup import add_user, one_local_fleet
from tests.telemetry_support import member_token
from tuneplane.app import input_limits, webhook_targets
from tuneplane.app.db import Database
from tuneplane.app.node_gateway.aiodb import AsyncDatabase
from tuneplane.app.node_gateway.server import Gateway
from tuneplane.app.security import new_token
from tuneplane.app.telemetry import gateway as telemetry_gateway
from tuneplane.app.web import create_app

INT4, INT8 = 2**31 - 1, 2**63 - 1
WALK_VALUES = ["-1", "0", str(2**31), str(-(2**31) - 1), str(2**63), str(10**12), "1e3", ""]
UNKNOWN = "zz_walk_unknown"
DEMO = {"recipe": {"name": "demo", "params": {"steps": 2}}}


def declared_path_range(name: str) -> tuple[int, int]:
    """A path parameter's declared range: the SQL type it is looked up as (ids from 1, indexes from 0)."""
    return (0, INT4) if name.endswith("index") else (1, INT8)


def in_range(value: str, declared: tuple[int, int] | None) -> bool:
    if not re.fullmatch(r"-?[0-9]+", value):
        return False
    return declared is None or declared[0] <= int(value) <= declared[1]


# Fields that take more than one JSON type by design, and what is wrong for them.
WRONG_FOR = {"price": True}  # money: text ("2.50") or a number


def wrong_type(value: object, key: str = "") -> object:
    """A value of another JSON type than `value` (text for numbers and booleans, a number for text)."""
    if key in WRONG_FOR:
        return WRONG_FOR[key]
    if isinstance(value, bool):
        return "yes"
    if isinstance(value, int | float):
        return str(value)
    if isinstance(value, str):
        return 12345
    if isinstance(value, list):
        return "not-a-list"
    if isinstance(value, dict):
        return ["not", "an", "object"]
    return {"not": "null"}


class Walk:
    def __init__(self) -> None:
        self.failures: list[str] = []
        self.sent = 0

    def judge(self, what: str, status: int, outside: bool, text: str = "") -> None:
        self.sent += 1
        if status >= 500:
            self.failures.append(f"{what} -> {status} {text[:160]}")
        elif outside and 200 <= status < 300:
            self.failures.append(f"{what} -> {status} for a value outside its declared range")


@pytest.fixture
def world(db_url: str, db: Database, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[dict]:
    # A webhook's host resolves through a stub (never DNS): a public address, never connected to.
    monkeypatch.setattr(webhook_targets, "resolve", lambda _host, _port: ["93.184.216.34"])
    fleet = one_local_fleet(db)
    admin = add_user(db, "root", "admin", password="root-pw")
    job = make_job(db, admin, fleet)
    node_fleet = db.fetch_one("INSERT INTO fleets (name, backend) VALUES ('walknodes', 'node') RETURNING id")
    plaintext, digest = new_token("tpu")
    db.call("issue_scoped_api_token", admin, "walk", digest, None, [], False)
    app = create_app(db_url, config={"TP_DATA_DIR": str(tmp_path / "data"), "SECRET_KEY": "walk"})
    client = app.test_client()
    client.environ_base["HTTP_AUTHORIZATION"] = f"Bearer {plaintext}"
    client.environ_base["HTTP_ACCEPT"] = "application/json"
    yield {"app": app, "client": client, "job": job, "fleet": fleet, "node_fleet": node_fleet["id"],
           "admin": admin}  # fmt: skip


def valid_segments(world: dict) -> dict[str, str]:
    """A value for each string segment, so that only the walked parameter is hostile."""
    return {"name": "root", "job_id": str(world["job"]), "preview_id": "00000000-0000-0000-0000-000000000000",
            "filename": "console.js"}  # fmt: skip


# Per endpoint: a valid body (so an unknown field or a wrong type is what a 2xx would have accepted).
def bodies(world: dict) -> dict[str, tuple[str | None, dict]]:
    """endpoint -> (a string segment's value when the route's `<name>` is not a team, the body)."""
    return {
        "teams.team_create": (None, {"name": "walkteam"}),
        "teams.team_member": (None, {"username": "root", "role": "admin"}),
        "teams.team_quota": (None, {"fleet": "local", "guaranteed_gpus": 0, "limit_gpus": 1, "weight": 1.0,
                                    "overcommit": False}),
        "teams.team_webhook": (None, {"url": "https://hooks.invalid/x", "kinds": ["job.failed"]}),
        "tokens.create_token": (None, {"name": "walk2", "ttl": "1h", "read_only": False, "teams": []}),
        "usage.usage_price_set": (None, {"fleet": "local", "price": "2.5", "currency": "EUR"}),
        "fleet.fleet_create": (None, {"name": "walkfleet", "backend": "node", "capabilities": {}}),
        "fleet.enrollment_token_create": ("walknodes", {"ttl": "1h"}),
        "fleet.node_scheduling": (None, {"node": "local-1", "action": "cordon", "reason": "walk"}),
        "submit.create_preview": (None, DEMO),
        "auth.issue_token": (None, {"username": "root", "password": "root-pw", "name": "walk"}),
        "teams.team_priority": (None, {"max_class": "high", "fleet": "local"}),
        "fleet.idle_policy_set": ("local", {"action": "warn", "idle_after": "45m", "utilization_below": 5.0,
                                            "power_below": 0.2, "idle_grace": "10m"}),
        "jobs_launch.cancel": (None, {"reason": "walk"}),
        "fleet.access_mode": ("local", {"mode": "listed"}),
        "fleet.team_access": ("local", {"team": "root", "action": "grant", "slurm_account": "acct"}),
    }  # fmt: skip


NOT_JSON = {
    "submit.upload_source": "takes the archive's bytes (application/gzip), never JSON",
    "artifacts.put_chunk": "takes a chunk's bytes",
    "auth.login_submit": "a form post (CSRF) of the login page",
    "auth.logout": "a form post (CSRF)",
}


def test_every_console_route_refuses_hostile_values_without_a_5xx(world: dict) -> None:
    client: FlaskClient = world["client"]
    app = world["app"]
    walk = Walk()
    segments = valid_segments(world)
    known_bodies = bodies(world)
    int_path = re.compile(r"<(?:int:)?([a-z_]*(?:_id|index))>")
    for rule in sorted(app.url_map.iter_rules(), key=lambda r: r.rule):
        methods = sorted(rule.methods - {"HEAD", "OPTIONS"})
        names = int_path.findall(rule.rule)

        def url(walked: str | None = None, value: str = "", rule=rule, names=names) -> str:
            def fill(match: re.Match) -> str:
                name = match.group(2)
                if name == walked:
                    return value
                if name in names:
                    return str(world["job"]) if name == "job_id" else "1"
                return segments.get(name, "x")

            return re.sub(r"<(?:([a-z]+):)?([a-z_]+)>", fill, rule.rule)

        for method in methods:
            call = getattr(client, method.lower())
            # Path integers, one at a time.
            for name in names:
                for value in WALK_VALUES:
                    response = call(url(name, value), json={} if method != "GET" else None)
                    outside = not in_range(value, declared_path_range(name))
                    walk.judge(f"{method} {rule.rule} {name}={value!r}", response.status_code, outside,
                               response.get_data(as_text=True))  # fmt: skip
            if method == "GET":
                for param, declared in input_limits.INT_PARAMS.items():
                    for value in WALK_VALUES:
                        response = call(url(), query_string={param: value})
                        # An empty parameter is an absent one (the endpoint's default).
                        outside = value != "" and not in_range(value, declared)
                        walk.judge(f"GET {rule.rule}?{param}={value!r}", response.status_code, outside,
                                   response.get_data(as_text=True))  # fmt: skip
                continue
            if rule.endpoint in NOT_JSON:
                continue
            segment, body = known_bodies.get(rule.endpoint, (None, {}))
            target = url() if segment is None else url().replace("/root/", f"/{segment}/", 1)
            variants = [(f"unknown field {UNKNOWN}", {**body, UNKNOWN: 1})]
            variants += [
                (f"{key} of the wrong type", {**body, key: wrong_type(v, key)}) for key, v in body.items()
            ]
            for what, sent in variants:
                response = call(target, json=sent)
                walk.judge(f"{method} {rule.rule} {what}", response.status_code, True,
                           response.get_data(as_text=True))  # fmt: skip
    # The walk's bodies are valid ones, so what refused the variants was the unknown field or the type.
    for endpoint, (segment, body) in known_bodies.items():
        rule = next(r for r in app.url_map.iter_rules() if r.endpoint == endpoint)
        path = re.sub(r"<(?:[a-z]+:)?([a-z_]+)>", lambda m: segments.get(m.group(1), "x"), rule.rule)
        answer = client.post(
            path if segment is None else path.replace("/root/", f"/{segment}/", 1), json=body
        )
        assert 200 <= answer.status_code < 300, (endpoint, answer.get_json())
    assert walk.sent > 1000
    assert walk.failures == [], "\n".join(walk.failures)


def test_every_gateway_route_refuses_hostile_values_without_a_5xx(db_url: str, db: Database) -> None:
    from tests.telemetry_support import make_job as telemetry_job
    from tests.telemetry_support import make_user

    enroll_token = make_token(db, fleet="walkgw") if _node_fleet(db, "walkgw") else ""
    points_token = member_token(db, telemetry_job(db, make_user(db, "walker")))
    point = {"name": "loss", "step": 1, "value": 0.5}
    json_bodies = {
        "/v1/enroll": ({}, {"token": enroll_token, "name": "walk-node"}),
        "/v1/telemetry/points": (
            {"Authorization": f"Bearer {points_token}"},
            {"client": "walk", "seq": 1, "points": [point]},
        ),
    }
    walk = Walk()

    async def scenario() -> None:
        node = Gateway(AsyncDatabase(db_url, max_size=4), name="walk-gw", poll_interval=0.5)
        telemetry = telemetry_gateway.create_app(db_url, pool_max=2)
        servers = [TestServer(node.make_app(), host="127.0.0.1"), TestServer(telemetry, host="127.0.0.1")]
        for server in servers:
            await server.start_server()
        try:
            for server in servers:
                base = f"http://127.0.0.1:{server.port}"
                async with httpx.AsyncClient(base_url=base, timeout=30) as client:
                    await _walk_gateway(server.app, client, walk, json_bodies)
        finally:
            for server in servers:
                await server.close()

    asyncio.run(scenario())
    assert walk.sent > 200
    assert walk.failures == [], "\n".join(walk.failures)


def _node_fleet(db: Database, name: str) -> int:
    return db.fetch_one("INSERT INTO fleets (name, backend) VALUES (%s, 'node') RETURNING id", (name,))["id"]


async def _walk_gateway(app, client: httpx.AsyncClient, walk: Walk, json_bodies: dict) -> None:
    for route in app.router.routes():
        info = route.resource.get_info() if route.resource is not None else {}
        pattern = info.get("formatter") or info.get("path")
        if pattern is None or route.method == "HEAD":
            continue
        params = re.findall(r"\{([a-z_]+)\}", pattern)

        def url(walked: str | None = None, value: str = "", pattern=pattern) -> str:
            def fill(match: re.Match) -> str:
                return (
                    value
                    if match.group(1) == walked
                    else ("1" if match.group(1).endswith(("_id", "index")) else "x")
                )

            return re.sub(r"\{([a-z_]+)\}", fill, pattern)

        for name in (p for p in params if p.endswith(("_id", "index"))):
            for value in WALK_VALUES:
                answer = await client.request(route.method, url(name, value))
                walk.judge(f"{route.method} {pattern} {name}={value!r}", answer.status_code,
                           not in_range(value, declared_path_range(name)), answer.text)  # fmt: skip
        if route.method == "GET" and "control" not in pattern:
            for param, declared in input_limits.INT_PARAMS.items():
                for value in WALK_VALUES:
                    answer = await client.get(url(), params={param: value})
                    outside = value != "" and not in_range(value, declared)
                    walk.judge(f"GET {pattern}?{param}={value!r}", answer.status_code, outside, answer.text)
        if route.method in ("POST", "PUT"):
            headers, body = json_bodies.get(pattern, ({}, {}))
            variants = [(f"unknown field {UNKNOWN}", {**body, UNKNOWN: 1})]
            variants += [
                (f"{key} of the wrong type", {**body, key: wrong_type(v, key)}) for key, v in body.items()
            ]
            for what, sent in variants:
                answer = await client.request(route.method, url(), json=sent, headers=headers)
                walk.judge(f"{route.method} {pattern} {what}", answer.status_code, True, answer.text)
