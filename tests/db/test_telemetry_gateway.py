"""The telemetry gateway over real HTTP: scope checks, de-duplication, refusals with reasons, the SDK path."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator

import httpx
import pytest

from tests.helpers import wait_for
from tests.telemetry_support import (
    GatewayThread,
    make_job,
    make_user,
    member_token,
    running_gateway,
    user_api_token,
)
from tuneplane.app.db import Database
from tuneplane.app.security import new_token
from tuneplane.app.telemetry import wire


@pytest.fixture
def gateway(db_url: str) -> Iterator[GatewayThread]:
    with running_gateway(db_url) as gw:
        yield gw


@pytest.fixture
def job(db: Database) -> int:
    return make_job(db, make_user(db, "alice"))


def _post(gateway: GatewayThread, token: str, payload: bytes) -> httpx.Response:
    return httpx.post(
        f"{gateway.url}/v1/telemetry/batches",
        content=payload,
        headers={"Authorization": f"Bearer {token}", "Content-Type": wire.CONTENT_TYPE},
    )


def _batch(seq: int = 1, *, scope: dict | None = None, n: int = 100, collector: str = "c1") -> bytes:
    steps = list(range(n))
    return wire.encode(
        collector,
        seq,
        [("jsonl:m.jsonl", "loss", n)],
        steps,
        [s * 0.5 for s in steps],
        [1000.0 + s for s in steps],
        scope=scope,
    )


def _stored(db: Database, job: int) -> list[tuple]:
    return [
        (r["attempt"], r["member_rank"], r["name"], r["step"], r["value"])
        for r in db.fetch_all(
            "SELECT s.attempt, s.member_rank, s.name, p.step, p.value FROM telemetry_points p"
            " JOIN telemetry_series s ON s.id = p.series_id WHERE s.job_id = %s ORDER BY s.id, p.step",
            (job,),
        )
    ]


def test_batch_is_stored_with_its_steps_and_values(db: Database, gateway: GatewayThread, job: int) -> None:
    token = member_token(db, job, 1, 0)
    response = _post(gateway, token, _batch())
    assert response.status_code == 200, response.text
    assert response.json() == {"stored": 100, "refused": 0, "duplicate": False, "seq": 1}
    rows = _stored(db, job)
    assert rows[:2] == [(1, 0, "loss", 0, 0.0), (1, 0, "loss", 1, 0.5)] and len(rows) == 100
    series = db.fetch_one("SELECT * FROM telemetry_series WHERE job_id = %s", (job,))
    assert series["canonical"] == "loss" and series["point_count"] == 100
    assert (series["min_step"], series["max_step"], series["last_value"]) == (0, 99, 49.5)


def test_resent_batch_is_skipped_by_the_ledger(db: Database, gateway: GatewayThread, job: int) -> None:
    token = member_token(db, job)
    payload = _batch(7)
    assert _post(gateway, token, payload).json()["duplicate"] is False
    again = _post(gateway, token, payload)
    assert again.status_code == 200
    assert again.json() == {"stored": 0, "refused": 0, "duplicate": True, "seq": 7}
    assert len(_stored(db, job)) == 100
    rollup = db.fetch_one("SELECT sum(n) AS n FROM telemetry_rollups WHERE width = 64")
    assert rollup["n"] == 100


def test_same_seq_with_other_content_is_refused(db: Database, gateway: GatewayThread, job: int) -> None:
    token = member_token(db, job)
    assert _post(gateway, token, _batch(3, n=10)).status_code == 200
    response = _post(gateway, token, _batch(3, n=11))
    assert response.status_code == 409 and "other content" in response.json()["error"]
    assert response.json()["fields"] == {"seq": response.json()["error"]}


def test_another_members_token_cannot_write_this_members_data(
    db: Database, gateway: GatewayThread, job: int
) -> None:
    other = member_token(db, job, 1, 1)
    response = _post(gateway, other, _batch(scope={"job_id": job, "attempt": 1, "member": 0}))
    assert response.status_code == 403
    assert "only job" in response.json()["error"] and "scope" in response.json()["fields"]
    assert _stored(db, job) == []


def test_token_writes_only_into_its_own_scope(db: Database, gateway: GatewayThread, job: int) -> None:
    token = member_token(db, job, 2, 3)
    assert _post(gateway, token, _batch(n=5)).status_code == 200
    assert {(a, m) for a, m, *_ in _stored(db, job)} == {(2, 3)}


def test_expired_token_is_refused(db: Database, gateway: GatewayThread, job: int) -> None:
    token = member_token(db, job, ttl=dt.timedelta(milliseconds=200))
    wait_for(lambda: _post(gateway, token, _batch(1)).status_code == 401, timeout=10, what="token expiry")
    response = _post(gateway, token, _batch(2, collector="after-expiry"))
    assert response.status_code == 401 and response.json()["error"] == "telemetry token expired"
    assert db.fetch_all("SELECT * FROM telemetry_batches WHERE collector_id = 'after-expiry'") == []


def test_revoked_token_is_refused(db: Database, gateway: GatewayThread, job: int) -> None:
    token = member_token(db, job)
    assert db.call("revoke_telemetry_tokens", job, None)[0]["revoke_telemetry_tokens"] == 1
    assert _post(gateway, token, _batch()).status_code == 401


def test_user_api_token_is_refused(db: Database, gateway: GatewayThread, job: int) -> None:
    admin = make_user(db, "root", "admin")
    response = _post(gateway, user_api_token(db, admin), _batch())
    assert response.status_code == 401 and response.json()["error"] == "not a telemetry token"


def test_node_control_credential_is_refused(db: Database, gateway: GatewayThread, job: int) -> None:
    _enroll, enroll_hash = new_token("tpe")
    credential, credential_hash = new_token("tpn")
    db.call("create_fleet", "gpu-fleet", "node")
    db.call("create_enrollment_token", "gpu-fleet", enroll_hash, dt.timedelta(hours=1), None)
    db.call("enroll_node", enroll_hash, "node-1", credential_hash, None)
    assert db.call("authenticate_node_credential", credential_hash)  # a live node credential…
    response = _post(gateway, credential, _batch())
    assert response.status_code == 401  # …is not a telemetry credential
    assert _stored(db, job) == []


def test_missing_token_and_malformed_batch_are_4xx_with_a_reason(
    db: Database, gateway: GatewayThread, job: int
) -> None:
    token = member_token(db, job)
    missing = httpx.post(f"{gateway.url}/v1/telemetry/batches", content=_batch())
    assert missing.status_code == 401 and missing.json()["fields"] == {"token": missing.json()["error"]}
    garbage = _post(gateway, token, b"not a batch at all")
    assert garbage.status_code == 400 and "bad magic" in garbage.json()["error"]
    truncated = _post(gateway, token, _batch()[:-8])
    assert truncated.status_code == 400 and "points need" in truncated.json()["error"]


def test_batch_over_the_point_limit_is_refused(db: Database, gateway: GatewayThread, job: int) -> None:
    admin = make_user(db, "root", "admin")
    db.call("set_telemetry_settings", admin, None, None, 50)
    response = _post(gateway, member_token(db, job), _batch(n=51))
    assert response.status_code == 413 and "limit is 50" in response.json()["error"]


def test_scope_endpoint_names_the_tokens_member(db: Database, gateway: GatewayThread, job: int) -> None:
    token = member_token(db, job, 2, 1)
    body = httpx.get(f"{gateway.url}/v1/telemetry/scope", headers={"Authorization": f"Bearer {token}"}).json()
    assert (body["job_id"], body["attempt"], body["member"]) == (job, 2, 1)


def test_sdk_json_points_are_stored_and_deduplicated(db: Database, gateway: GatewayThread, job: int) -> None:
    token = member_token(db, job)
    body = {
        "client": "sdk-1",
        "seq": 1,
        "points": [
            {"name": "loss", "step": 1, "value": 0.5},
            {"name": "lr", "step": 1, "value": 0.1},
            {"name": "loss", "step": 2, "value": 0.25, "wall_time": 5.0},
        ],
    }
    headers = {"Authorization": f"Bearer {token}"}
    first = httpx.post(f"{gateway.url}/v1/telemetry/points", json=body, headers=headers)
    again = httpx.post(f"{gateway.url}/v1/telemetry/points", json=body, headers=headers)
    assert first.json()["stored"] == 3 and again.json()["duplicate"] is True
    assert sorted((n, s, v) for _, _, n, s, v in _stored(db, job)) == [
        ("loss", 1, 0.5),
        ("loss", 2, 0.25),
        ("lr", 1, 0.1),
    ]
    bad = httpx.post(
        f"{gateway.url}/v1/telemetry/points",
        json={
            "client": "x",
            "seq": 1,
            "points": [
                {"name": "", "step": 1, "value": 1},
                {"name": "big", "step": 1, "value": 10**400},
                {"name": "far", "step": 2**63, "value": 1},
                {"name": "fine", "step": 3, "value": 1},
            ],
        },
        headers=headers,
    )
    assert bad.status_code == 200 and bad.json()["stored"] == 1 and bad.json()["refused"] == 3
    refused = db.fetch_all(
        "SELECT name, reason, count FROM telemetry_refusals WHERE job_id = %s ORDER BY name", (job,)
    )
    assert [(r["name"], r["reason"], r["count"]) for r in refused] == [
        ("", "empty name", 1),
        ("big", "number too large for a float64", 1),
        ("far", "step outside ±(2^53-1)", 1),
    ]
