"""The input-limits layer: each hostile input of issue 15 is a 4xx naming the field, never a 500, and
nothing is stored. Console server through Flask's test client; node gateway over real HTTP on loopback."""

from __future__ import annotations

import asyncio
import io
import json

import httpx
import pytest

from tests.db.test_node_gateway import running_gateway
from tests.submission_setup import add_user, one_local_fleet
from tuneplane.app.db import Database
from tuneplane.app.web import create_app

DEEP = "[" * 10_000 + "]" * 10_000


@pytest.fixture
def console(db_url: str, db: Database, tmp_path):
    one_local_fleet(db)
    add_user(db, "admin", role="admin", password="admin-pw")
    app = create_app(db_url, config={"TP_DATA_DIR": str(tmp_path / "data"), "SECRET_KEY": "test"})
    client = app.test_client()
    token = client.post("/api/tokens", json={"username": "admin", "password": "admin-pw"}).get_json()["token"]
    client.environ_base["HTTP_AUTHORIZATION"] = f"Bearer {token}"
    client.environ_base["HTTP_ACCEPT"] = "application/json"
    return client


def _refused(response, status: int, field: str) -> dict:
    assert response.status_code == status, response.get_data(as_text=True)[:500]
    body = response.get_json()
    assert field in body["fields"], body
    return body


def _counts(db: Database) -> tuple:
    row = db.fetch_one(
        "SELECT (SELECT count(*) FROM previews) AS previews, (SELECT count(*) FROM jobs) AS jobs,"
        " (SELECT count(*) FROM fleets) AS fleets, (SELECT count(*) FROM enrollment_tokens) AS tokens,"
        " (SELECT count(*) FROM api_tokens) AS api_tokens"
    )
    return tuple(row.values())


def test_json_nested_ten_thousand_deep_is_a_400_everywhere(console, db: Database) -> None:
    before = _counts(db)
    for path in ("/previews", "/fleets", "/api/tokens", "/jobs/1/cancel"):
        response = console.post(path, data=DEEP, content_type="application/json")
        _refused(response, 400, "body")
    # Shallower than Python's recursion limit, deeper than the layer allows: refused by the walk.
    response = console.post("/previews", data="[" * 200 + "]" * 200, content_type="application/json")
    assert response.status_code == 400
    assert _counts(db) == before


def test_nul_and_lone_surrogates_in_strings_are_refused_by_name(console, db: Database) -> None:
    before = _counts(db)
    spec = {"recipe": {"name": "demo"}, "env": {"A": "x\u0000y"}}
    _refused(console.post("/previews", json=spec), 400, "env.A")
    raw = '{"recipe": {"name": "demo"}, "env": {"B": "\\ud800"}}'
    _refused(console.post("/previews", data=raw, content_type="application/json"), 400, "env.B")
    _refused(console.get("/jobs?state=queued%00"), 400, "state")
    _refused(console.get("/fleets/lo%00cal"), 400, "name")
    _refused(console.post("/fleets", data={"name": "a\x00b"}), 400, "name")
    assert _counts(db) == before


def test_integers_beyond_sql_ranges_are_4xx(console) -> None:
    _refused(console.get(f"/jobs?limit={2**31}"), 400, "limit")
    _refused(console.get("/jobs?limit=" + "9" * 5000), 400, "limit")
    _refused(console.get(f"/jobs?before={2**63}"), 400, "before")
    _refused(console.get(f"/jobs/1/logs?after={2**64}"), 400, "after")
    _refused(console.get(f"/jobs/1/metrics?step_from={2**63}"), 400, "step_from")
    assert console.get(f"/artifacts/{2**63}").status_code == 404
    assert console.get(f"/jobs/{2**63}/metrics").status_code == 404
    assert console.get(f"/jobs/{2**70}").status_code == 404
    big = {"recipe": {"name": "demo", "params": {"steps": 2**70}}}
    _refused(console.post("/previews", json=big), 400, "recipe.params.steps")


def test_memory_with_hundreds_of_digits_and_coerced_types_are_refused(console, db: Database) -> None:
    before = _counts(db)
    spec = {"recipe": {"name": "demo"}, "resources": {"memory_per_node": "9" * 300}}
    _refused(console.post("/previews", json=spec), 422, "resources.memory_per_node")
    _refused(console.post("/previews", json={"recipe": {"name": "demo"}, "resources": {"nodes": True}}),
             422, "resources.nodes")  # fmt: skip
    _refused(
        console.post("/previews", json={"recipe": {"name": "demo"}, "max_attempts": "2"}), 422, "max_attempts"
    )
    _refused(console.post("/previews", json={"recipe": {"name": "demo"}, "fleet": 5}), 422, "fleet")
    assert _counts(db) == before


def test_env_count_and_total_size_are_bounded(console) -> None:
    many = {"recipe": {"name": "demo"}, "env": {f"V{i}": "x" for i in range(300)}}
    _refused(console.post("/previews", json=many), 422, "env")
    large = {"recipe": {"name": "demo"}, "env": {f"V{i}": "x" * 30_000 for i in range(6)}}
    body = _refused(console.post("/previews", json=large), 422, "env")
    assert "process environment" in body["error"]


def test_fleet_endpoints_refuse_wrong_types_and_a_thirty_digit_ttl(console, db: Database) -> None:
    before = _counts(db)
    _refused(console.post("/fleets", json={"name": 5}), 400, "name")
    _refused(console.post("/fleets", json={"name": "x", "capabilities": []}), 400, "capabilities")
    _refused(console.post("/fleets/local/enrollment-tokens", json={"ttl": "9" * 30}), 400, "ttl")
    _refused(console.post("/fleets/local/enrollment-tokens", json={"ttl": "31d"}), 400, "ttl")
    _refused(console.post("/nodes/scheduling", json={"node": "local-1", "action": ["cordon"]}), 400, "action")
    _refused(console.post("/nodes/scheduling", json={"node": {}, "action": "cordon"}), 400, "node")
    _refused(console.post("/jobs/1/cancel", json=["x"]), 400, "body")
    assert _counts(db) == before


def test_login_next_with_cr_lf_or_backslash_goes_home(db_url: str, db: Database) -> None:
    add_user(db, "alice", password="alice-pw")
    client = create_app(db_url, config={"SECRET_KEY": "test"}).test_client()
    for target in ("/jobs\r\nSet-Cookie: x=1", "/\\evil.example", "/%0d%0aX: y"):
        client.get("/login")
        with client.session_transaction() as session:
            csrf = session["csrf_token"]
        response = client.post(
            "/login", data={"username": "alice", "password": "alice-pw", "next": target, "csrf_token": csrf}
        )
        assert response.status_code == 303
        location = response.headers["Location"]
        assert "\n" not in location and "\r" not in location and not location.startswith("/\\")
    assert location == "/%0d%0aX:%20y"  # percent-encoded CR/LF in a path is just a path


def test_error_answers_echo_a_bounded_slice_of_the_input(console) -> None:
    response = console.get("/jobs/" + "x" * 4000)
    assert response.status_code == 404
    assert len(response.get_data()) < 1500


def test_node_gateway_refuses_deep_json_nul_and_huge_ints_without_a_500(db_url: str, db: Database) -> None:
    async def scenario() -> list[httpx.Response]:
        async with running_gateway(db_url) as (_gateway, url), httpx.AsyncClient(base_url=url) as client:
            headers = {"Content-Type": "application/json"}
            return [
                await client.post("/v1/enroll", content=DEEP, headers=headers),
                await client.post("/v1/enroll", content=DEEP, headers={"Content-Type": "text/plain"}),
                await client.post("/v1/enroll", json={"token": "t\u0000", "name": "n"}),
                await client.post("/v1/enroll", content='{"token": "\\udc00", "name": "n"}', headers=headers),
                await client.post("/v1/enroll", json={"token": "t", "name": "n", "hostname": 2**64}),
                await client.post("/v1/enroll", content=b"\xff\xfe", headers=headers),
                await client.get("/v1/files/capsule/a%00b", headers={"Authorization": "Bearer x"}),
            ]

    answers = asyncio.run(scenario())
    for response in answers:
        assert 400 <= response.status_code < 500, response.text
        assert response.json()["fields"], response.text
    assert db.fetch_one("SELECT count(*) AS n FROM nodes")["n"] == 0


def test_refused_unauthenticated_gateway_calls_write_a_bounded_number_of_events(
    db_url: str, db: Database
) -> None:
    async def scenario() -> None:
        async with running_gateway(db_url) as (_gateway, url), httpx.AsyncClient(base_url=url) as client:
            for i in range(60):
                answer = await client.post("/v1/enroll", json={"token": f"tpe_wrong{i}", "name": "n"})
                assert answer.status_code == 401
            for _ in range(40):
                answer = await client.post(
                    "/v1/reports", json={"epoch": 1, "kind": "note", "payload": {}},
                    headers={"Authorization": "Bearer tpn_wrong"},
                )  # fmt: skip
                assert answer.status_code == 401

    asyncio.run(scenario())
    rows = db.fetch_all("SELECT details FROM node_events WHERE kind = 'refused' ORDER BY id")
    assert 2 <= len(rows) <= 10, len(rows)


def test_refusal_audit_counts_what_it_leaves_out() -> None:
    from tuneplane.app.node_gateway.refusal_audit import RefusalAudit

    audit = RefusalAudit(window_s=60, per_source=2, total=100)
    answers = [audit.admit("enroll", "10.0.0.1", now=t) for t in range(10)]
    assert answers[:2] == [0, 0] and answers[2:] == [None] * 8
    assert audit.admit("enroll", "10.0.0.1", now=61) == 8  # the next row says 8 were left out
    assert audit.admit("enroll", "10.0.0.2", now=61) == 0


def test_bounded_json_parser_names_the_path() -> None:
    from tuneplane.app.errors import Refusal
    from tuneplane.app.input_limits import load_json

    with pytest.raises(Refusal) as caught:
        load_json(json.dumps({"a": [{"b": "x\u0000"}]}))
    assert caught.value.fields == {"a.0.b": "a.0.b contains a NUL character"}
    with pytest.raises(Refusal):
        load_json('{"a": NaN}')
    assert load_json('{"a": [1, 2.5, "ok", null, true]}') == {"a": [1, 2.5, "ok", None, True]}


def test_source_upload_with_a_non_archive_content_type_is_a_415(console, db: Database) -> None:
    from tests import archive_builders as ab

    data = ab.honest()
    for ctype in ("text/plain", "image/png"):
        _refused(console.post("/sources", data=data, content_type=ctype), 415, "archive")
    multipart = {"archive": (io.BytesIO(data), "a.tar.gz", "text/html")}
    _refused(console.post("/sources", data=multipart, content_type="multipart/form-data"), 415, "archive")
    assert db.fetch_one("SELECT count(*) AS n FROM source_archives")["n"] == 0
    unlabelled = console.post("/sources", data=data, headers={"Content-Type": ""})
    _refused(unlabelled, 415, "archive")
    assert "no Content-Type" in unlabelled.get_json()["error"]
    assert db.fetch_one("SELECT count(*) AS n FROM source_archives")["n"] == 0
    assert console.post("/sources", data=data, content_type="application/gzip").status_code == 201


def test_telemetry_points_refuse_coerced_types(db_url: str, db: Database) -> None:
    from tests.telemetry_support import make_job, make_user, member_token, running_gateway

    token = member_token(db, make_job(db, make_user(db, "carol")))
    with running_gateway(db_url) as gateway:
        url = f"http://127.0.0.1:{gateway.port}/v1/telemetry/points"
        headers = {"Authorization": f"Bearer {token}"}
        for point, field in (
            ({"name": "loss", "step": "1", "value": 0.5}, "points.0.step"),
            ({"name": "loss", "step": True, "value": 0.5}, "points.0.step"),
            ({"name": "loss", "step": 1, "value": "0.5"}, "points.0.value"),
        ):
            answer = httpx.post(url, json={"client": "c", "seq": 1, "points": [point]}, headers=headers)
            assert answer.status_code == 400, answer.text
            assert any(name.startswith(field) for name in answer.json()["fields"]), answer.text
        deep = httpx.post(url, content=DEEP, headers={**headers, "Content-Type": "text/plain"})
        assert deep.status_code == 400 and "body" in deep.json()["fields"]
    assert db.fetch_one("SELECT count(*) AS n FROM telemetry_series")["n"] == 0


def test_a_json_body_over_8_mib_is_a_413_before_it_is_parsed(console, db: Database) -> None:
    before = _counts(db)
    big = b'{"recipe": {"name": "demo"}, "env": {"A": "' + b"x" * (9 * 1024 * 1024) + b'"}}'
    _refused(console.post("/previews", data=big, content_type="application/json"), 413, "body")
    assert _counts(db) == before


# ---- the edges of issue 24 (point 7): each a 4xx naming the field, nothing stored ----------------------


def _header_batch(header: bytes) -> bytes:
    import struct

    return struct.pack("<4sI", b"TPB1", len(header)) + header


DEEP_BRACKETS = b"[" * 10_000 + b"]" * 10_000
DEEP_HEALTH = b'{"a":' * 10_000 + b"1" + b"}" * 10_000


def _zero_point_series_past_the_cap() -> bytes:
    from tuneplane.app.telemetry import wire

    return wire.encode("c", 5, [("sdk", f"new{i}", 0) for i in range(3)], [], [], [])


@pytest.mark.parametrize(
    ("body", "field"),
    [
        pytest.param(
            lambda: _header_batch(b'{"collector":"c","seq":2,"series":[],"extra":' + DEEP_BRACKETS + b"}"),
            "extra",
            id="header-nested-10000-deep",
        ),
        pytest.param(
            lambda: _header_batch(b'{"collector":"c","seq":3,"series":[],"health":' + DEEP_HEALTH + b"}"),
            "health",
            id="health-nested-10000-deep",
        ),
        pytest.param(
            lambda: _header_batch(b'{"collector":"c","seq":4,"series":[["sdk","lo\\ud800ss",0]]}'),
            "series",
            id="series-name-with-a-lone-surrogate",
        ),
        pytest.param(_zero_point_series_past_the_cap, "series", id="zero-point-series-past-the-series-cap"),
    ],
)
def test_a_telemetry_batch_edge_is_a_400_naming_the_field_and_stores_nothing(
    db_url: str, db: Database, body, field: str
) -> None:
    from tests.telemetry_support import make_job, make_user, member_token, running_gateway
    from tuneplane.app.telemetry import wire

    token = member_token(db, make_job(db, make_user(db, "carol")))
    headers = {"Authorization": f"Bearer {token}", "Content-Type": wire.CONTENT_TYPE}
    db.fetch_all("UPDATE telemetry_settings SET max_series_per_member = 2 RETURNING 1")  # set-up: a low cap
    with running_gateway(db_url) as gateway:
        url = f"{gateway.url}/v1/telemetry/batches"
        at_cap = wire.encode("c", 1, [("sdk", "a", 1), ("sdk", "b", 1)], [1, 1], [0.5, 0.5], [1.0, 1.0])
        assert httpx.post(url, content=at_cap, headers=headers).json()["stored"] == 2
        answer = httpx.post(url, content=body(), headers=headers)
    assert answer.status_code == 400, (answer.status_code, answer.text[:300])
    assert field in answer.json()["fields"], answer.text[:300]
    assert db.fetch_one("SELECT count(*) AS n FROM telemetry_series")["n"] == 2


def test_a_megabyte_field_is_echoed_as_a_bounded_excerpt(db_url: str, db: Database) -> None:
    from tests.telemetry_support import make_job, make_user, member_token, running_gateway
    from tuneplane.app.telemetry import wire

    token = member_token(db, make_job(db, make_user(db, "carol")))
    headers = {"Authorization": f"Bearer {token}", "Content-Type": wire.CONTENT_TYPE}
    huge = "k" * 1_000_000
    with running_gateway(db_url) as gateway:
        body = wire.encode("c", 1, [], [], [], [], scope={huge: 1})
        answer = httpx.post(f"{gateway.url}/v1/telemetry/batches", content=body, headers=headers)
    assert answer.status_code == 400 and "scope" in answer.json()["fields"]
    assert len(answer.content) < 2000  # at most 600 characters of the key, once in the error and the field


def test_both_gateways_announce_no_server_version(db_url: str, db: Database) -> None:
    from tests.telemetry_support import running_gateway as telemetry_gateway

    async def node_gateway_server() -> str:
        async with running_gateway(db_url) as (_gateway, url), httpx.AsyncClient(base_url=url) as client:
            return (await client.get("/v1/no-such-route")).headers.get("server", "")

    with telemetry_gateway(db_url) as gateway:
        answers = [httpx.get(f"{gateway.url}{path}").headers.get("server", "") for path in ("/healthz", "/x")]
    answers.append(asyncio.run(node_gateway_server()))
    for server in answers:
        assert server == "TunePlane", answers


def test_an_archive_member_of_an_unknown_type_is_refused_by_its_type(console, db: Database) -> None:
    from tests import archive_builders as ab

    for kind, said in ((b"Z", "tar type 'Z'"), (b"X", "extended header (tar type 'X')")):
        info, data = ab.file("odd", b"abc")
        info.type = kind
        archive = ab.build([ab.file("train.py"), (info, data)])
        body = _refused(
            console.post("/sources", data=archive, content_type="application/gzip"), 422, "archive"
        )
        assert said in body["error"] and "not a gzip-compressed" not in body["error"], body
    assert db.fetch_one("SELECT count(*) AS n FROM source_archives")["n"] == 0


def test_one_parameter_is_refused_with_one_range_whatever_the_value(console, db: Database) -> None:
    from tests.launch_fixtures import make_fleet, make_job

    job = make_job(db, db.fetch_one("SELECT id FROM users WHERE username = 'admin'")["id"], make_fleet(db))
    for path, field, values in (
        (f"/jobs/{job}/logs", "limit", ["0", str(2**31), "9" * 40]),
        (f"/jobs/{job}/metrics/raw?series=1", "limit", ["0", "5000", str(2**63)]),
        (f"/jobs/{job}/metrics", "max_points", ["0", str(2**40)]),
        (f"/jobs/{job}/logs", "after", ["-1", str(2**64)]),
    ):
        sep = "&" if "?" in path else "?"
        said = {_refused(console.get(f"{path}{sep}{field}={v}"), 400, field)["error"] for v in values}
        assert len(said) == 1 and "must be between" in said.pop(), (path, field)


def test_metrics_member_and_attempt_beyond_sql_integer_are_400_not_500(console, db: Database) -> None:
    """Issue 38: `member=2147483648` reached telemetry_job_series(integer) as a bigint: a 500."""
    from tests.launch_fixtures import make_fleet, make_job

    job = make_job(db, db.fetch_one("SELECT id FROM users WHERE username = 'admin'")["id"], make_fleet(db))
    for field, value in (("member", 2**31), ("member", -(2**31) - 1), ("member", -1), ("attempt", 10**12),
                         ("attempt", -1), ("attempt", 2**63)):  # fmt: skip
        body = _refused(console.get(f"/jobs/{job}/metrics?{field}={value}"), 400, field)
        assert "must be between" in body["error"] or "must be an integer" in body["error"]
    assert console.get(f"/jobs/{job}/metrics?member=0&attempt=1").status_code == 200


def test_durations_and_dates_take_ascii_digits_only(console) -> None:
    for since in ("３０d", "30 d", "２０２６-11-01"):
        _refused(console.get(f"/usage?since={since}"), 400, "since")
    assert console.get("/usage?since=30d").status_code == 200


def test_quota_bodies_are_strict_unknown_fields_and_coerced_booleans_refused(console, db: Database) -> None:
    db.call("create_team", db.fetch_one("SELECT id FROM users WHERE username = 'admin'")["id"], "vision")
    quotas = "/teams/vision/quotas"
    for body, field in (
        ({"fleet": "local", "guaranteed_gpus": 0, "overcommit": "yes"}, "overcommit"),
        ({"fleet": "local", "guaranteed_gpus": 0, "overcommit": 1}, "overcommit"),
        ({"fleet": "local", "guaranteed_gpus": "1"}, "guaranteed_gpus"),
        ({"fleet": "local", "guaranteed_gpus": 0, "limt_gpus": 2}, "limt_gpus"),
    ):
        _refused(console.post(quotas, json=body), 400, field)
    assert db.fetch_one("SELECT count(*) AS n FROM team_quotas")["n"] == 0


def test_an_sdk_batch_with_an_unknown_top_level_field_is_refused_by_name(db_url: str, db: Database) -> None:
    from tests.telemetry_support import make_job, make_user, member_token, running_gateway

    token = member_token(db, make_job(db, make_user(db, "carol")))
    point = {"name": "loss", "step": 1, "value": 0.5}
    with running_gateway(db_url) as gateway:
        url = f"http://127.0.0.1:{gateway.port}/v1/telemetry/points"
        headers = {"Authorization": f"Bearer {token}"}
        for body, field in (
            ({"client": "c", "seq": 1, "points": [point], "extra": 1}, "extra"),
            ({"client": "c", "seq": 1, "point": [point], "points": []}, "point"),
            ({"format": 2, "client": "c", "seq": 1, "points": [point]}, "format"),
        ):
            answer = httpx.post(url, json=body, headers=headers)
            assert answer.status_code == 400 and field in answer.json()["fields"], answer.text
        assert db.fetch_one("SELECT count(*) AS n FROM telemetry_series")["n"] == 0
        ok = httpx.post(url, json={"format": 1, "client": "c", "seq": 1, "points": [point]}, headers=headers)
        assert ok.status_code == 200, ok.text


def test_unauthenticated_healthz_says_only_that_it_is_alive(db_url: str, db: Database) -> None:
    from tests.telemetry_support import running_gateway as telemetry_gateway

    async def node_gateway() -> tuple[dict, dict]:
        async with running_gateway(db_url) as (_gateway, url), httpx.AsyncClient(base_url=url) as client:
            return (await client.get("/healthz")).json(), (await client.get("/v1/stats")).json()

    health, stats = asyncio.run(node_gateway())
    assert health == {"status": "ok"}
    assert {"version", "sessions", "gateway"} <= stats.keys()  # the counters: to a loopback peer only
    with telemetry_gateway(db_url) as gateway:
        assert httpx.get(f"{gateway.url}/healthz").json() == {"ok": True}


def test_an_integer_beyond_its_registered_sql_type_never_reaches_postgresql(db: Database) -> None:
    """The last guard (app/db_functions.check_args): had a view missed a range, the call would be sent
    with a bigint where the function takes an integer, found no function, and answered 500."""
    from tuneplane.app import db_functions as fn
    from tuneplane.app.errors import Refusal

    with pytest.raises(Refusal) as refused:
        db.call(fn.telemetry_job_series, 1, 1, None, None, 2**31, None)
    assert refused.value.status == 400 and "integer" in refused.value.message
