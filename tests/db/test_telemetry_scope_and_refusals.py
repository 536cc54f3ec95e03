"""Telemetry per point and per member, over real HTTP and real stored functions: a bad point is refused
alone, content errors are final 4xx (never "retry later"), the ledger belongs to the token's scope, a
member has a series cap, a final batch completes the member's metrics, and tokens stop working after the
member ends (drain grace) or its node is fenced."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from tests.db.test_telemetry_gateway import _post
from tests.helpers import wait_for
from tests.launch_fixtures import make_fleet, make_job, make_node, members_of, report, run_to_running
from tests.telemetry_support import GatewayThread, make_user, member_token, running_gateway
from tuneplane.app.db import Database
from tuneplane.app.telemetry import wire


@pytest.fixture
def gateway(db_url: str) -> Iterator[GatewayThread]:
    with running_gateway(db_url) as gw:
        yield gw


@pytest.fixture
def setup(db: Database) -> dict:
    user = make_user(db, "alice")
    fleet = make_fleet(db)
    node = make_node(db, fleet, "n0", gpus=4)
    return {"user": user, "fleet": fleet, "node": node}


def _job(db: Database, setup: dict) -> int:
    return make_job(db, setup["user"], setup["fleet"])


def _series_batch(
    series: list[tuple[str, str, list[int]]], seq: int = 1, collector: str = "c1", **kw
) -> bytes:
    steps = [s for _, _, st in series for s in st]
    return wire.encode(
        collector,
        seq,
        [(src, name, len(st)) for src, name, st in series],
        steps,
        [float(i) for i in range(len(steps))],
        [1000.0] * len(steps),
        **kw,
    )


def _stored(db: Database, job: int) -> list[tuple[str, int]]:
    rows = db.fetch_all(
        "SELECT s.name, p.step FROM telemetry_points p JOIN telemetry_series s ON s.id = p.series_id"
        " WHERE s.job_id = %s ORDER BY s.name, p.step",
        (job,),
    )
    return [(r["name"], r["step"]) for r in rows]


def _refusals(db: Database, job: int) -> dict[tuple[str, str], int]:
    rows = db.fetch_all("SELECT name, reason, count FROM telemetry_refusals WHERE job_id = %s", (job,))
    return {(r["name"], r["reason"]): r["count"] for r in rows}


def test_a_bad_point_is_refused_alone_and_the_rest_of_the_batch_is_stored(
    db: Database, gateway: GatewayThread, setup: dict
) -> None:
    job = _job(db, setup)
    token = member_token(db, job)
    payload = _series_batch(
        [
            ("jsonl:m.jsonl", "loss", list(range(2000))),
            ("jsonl:m.jsonl", "k" * 600, [1, 2]),
            ("jsonl:m.jsonl", "nul\x00name", [3]),
            ("jsonl:m.jsonl", "surrogate\ud800", [4]),
            ("jsonl:m.jsonl", "steps", [-(2**63), 5, 2**63 - 1, 2**53]),
        ]
    )
    response = _post(gateway, token, payload)
    assert response.status_code == 200, response.text
    assert response.json()["stored"] == 2001 and response.json()["refused"] == 7
    assert _stored(db, job) == [("loss", s) for s in range(2000)] + [("steps", 5)]
    assert _refusals(db, job) == {
        ("", "name longer than 512 characters"): 2,
        ("", "name holds a NUL or control character"): 1,
        ("", "name is not valid Unicode (lone surrogate)"): 1,
        ("steps", "step outside ±(2^53-1)"): 3,
    }
    member = db.fetch_one("SELECT * FROM telemetry_members WHERE job_id = %s", (job,))
    assert member["state"] == "collecting" and member["refused_points"] == 7


def test_content_errors_are_final_4xx_not_retry_later(
    db: Database, gateway: GatewayThread, setup: dict
) -> None:
    job = _job(db, setup)
    token = member_token(db, job)
    for seq, scope in enumerate(({"job_id": "7"}, {"job_id": job, "attempt": 1.5}, {"member": True}), 1):
        response = _post(gateway, token, _series_batch([("s", "loss", [1])], seq=seq, scope=scope))
        assert response.status_code == 400 and "scope" in response.json()["fields"], response.text
    bad_source = _post(gateway, token, _series_batch([("src\x00", "loss", [1]), ("ok", "loss", [2])], seq=10))
    assert bad_source.status_code == 200 and bad_source.json()["refused"] == 1
    # Free text in health with a NUL and a lone surrogate is made storable, not refused.
    health = _post(gateway, token, _series_batch([("ok", "x", [1])], seq=11, health={"a\x00": "b\ud800"}))
    assert health.status_code == 200, health.text
    garbage_collector = _post(gateway, token, _series_batch([("ok", "x", [2])], collector="c\x00", seq=12))
    assert garbage_collector.status_code == 400


def test_one_jobs_token_cannot_claim_another_jobs_collector_id_or_batch(
    db: Database, gateway: GatewayThread, setup: dict
) -> None:
    job_a, job_b = _job(db, setup), _job(db, setup)
    token_a, token_b = member_token(db, job_a), member_token(db, job_b)
    assert (
        _post(gateway, token_a, _series_batch([("s", "loss", [1, 2])], collector="shared")).status_code == 200
    )
    # Job B names the same collector id and seq with other content: its own batch, stored for B.
    other = _post(gateway, token_b, _series_batch([("s", "loss", [7])], collector="shared"))
    assert other.status_code == 200 and other.json()["duplicate"] is False
    # And job B re-sending job A's exact batch does not make it a "duplicate" of A's.
    same = _post(gateway, token_b, _series_batch([("s", "loss", [1, 2])], collector="shared", seq=2))
    assert same.json()["duplicate"] is False
    assert _stored(db, job_a) == [("loss", 1), ("loss", 2)]
    assert _stored(db, job_b) == [("loss", 1), ("loss", 2), ("loss", 7)]
    rows = db.fetch_all(
        "SELECT job_id, batches FROM telemetry_collectors WHERE collector_id = 'shared' ORDER BY 1"
    )
    assert [(r["job_id"], r["batches"]) for r in rows] == [(job_a, 1), (job_b, 2)]


def test_a_member_has_a_series_cap_with_a_clear_refusal(
    db: Database, gateway: GatewayThread, setup: dict
) -> None:
    db.fetch_all("UPDATE telemetry_settings SET max_series_per_member = 3 RETURNING 1")
    job = _job(db, setup)
    token = member_token(db, job)
    series = [("s", f"m{i}", [i, i + 100]) for i in range(5)]
    response = _post(gateway, token, _series_batch(series))
    assert response.json()["stored"] == 6 and response.json()["refused"] == 4
    assert {name for name, _ in _stored(db, job)} == {"m0", "m1", "m2"}
    assert _refusals(db, job) == {
        ("m3", "the member has reached its limit of 3 series"): 2,
        ("m4", "the member has reached its limit of 3 series"): 2,
    }
    # Known series keep working at the cap.
    assert _post(gateway, token, _series_batch([("s", "m1", [500])], seq=2)).json()["stored"] == 1


def test_final_batch_completes_the_members_metrics_and_revokes_its_token(
    db: Database, gateway: GatewayThread, setup: dict
) -> None:
    job = _job(db, setup)
    token = member_token(db, job)
    damage = [("tensorboard:run", "run/events.out.tfevents.1", 130, 70, "record length fails its CRC")]
    assert _post(gateway, token, _series_batch([("s", "loss", [1])], damage=damage)).status_code == 200
    assert _post(gateway, token, _series_batch([], seq=2, final=True)).status_code == 200
    admin = make_user(db, "root", "admin")
    (member,) = db.call("telemetry_job_members", admin, job)
    assert (member["state"], member["damaged_regions"]) == ("complete", 1)
    problems = db.call("telemetry_job_problems", admin, job, 10)
    assert [(p["kind"], p["what"], p["file_offset"], p["bytes"]) for p in problems] == [
        ("damaged", "run/events.out.tfevents.1", 130, 70)
    ]
    assert _post(gateway, token, _series_batch([("s", "loss", [2])], seq=3)).status_code == 401


def test_a_cancelled_jobs_token_is_refused_once_the_drain_grace_passed(
    db: Database, gateway: GatewayThread, setup: dict
) -> None:
    db.fetch_all("UPDATE telemetry_settings SET drain_grace = interval '1 second' RETURNING 1")
    job = _job(db, setup)
    db.call("reserve_next", setup["fleet"], 1000)
    (m,) = run_to_running(db, job)
    token = member_token(db, job, 1, 0)
    assert _post(gateway, token, _series_batch([("s", "loss", [1])])).status_code == 200
    db.call("cancel_job", job, setup["user"], "enough")
    report(db, "member_exited", m, exit_code=143)
    assert members_of(db, job)[0]["state"] not in ("running", "stopping")
    # Inside the grace the collector's last batches are still taken…
    assert _post(gateway, token, _series_batch([("s", "loss", [2])], seq=2)).status_code == 200
    # …after it, the token is refused, and the member's metrics say they are incomplete.
    wait_for(
        lambda: _post(gateway, token, _series_batch([("s", "loss", [3])], seq=3)).status_code == 401,
        timeout=20,
        what="token refused after the drain grace",
    )
    admin = make_user(db, "root", "admin")
    (member,) = db.call("telemetry_job_members", admin, job)
    assert member["state"] == "incomplete" and "drain grace" in member["reason"]


def test_fencing_the_node_revokes_its_members_tokens_at_once(
    db: Database, gateway: GatewayThread, setup: dict
) -> None:
    job = _job(db, setup)
    db.call("reserve_next", setup["fleet"], 1000)
    run_to_running(db, job)
    token = member_token(db, job, 1, 0)
    assert _post(gateway, token, _series_batch([("s", "loss", [1])])).status_code == 200
    db.call("fence_node", "n0", "disk on fire", "test")
    response = _post(gateway, token, _series_batch([("s", "loss", [2])], seq=2))
    assert response.status_code == 401 and json.loads(response.text)["error"] == "telemetry token revoked"
