"""Database trouble that is nobody's fault — a deadlock victim, a lost connection — never becomes a 500 or a
dropped node session: the console's cancel runs its transaction again (then answers 503), and the node
gateway answers a report it could not record as retryable and keeps the session (the agent sends it again).

Deadlocks here are real: a second session holds the attempt row and then asks for the job row that cancel
holds (cancel locks job → attempt), and has the longer deadlock_timeout, so PostgreSQL picks cancel as the
victim. Lost connections are real too: the gateway's pooled backends are terminated."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
import psycopg
import pytest
from flask.testing import FlaskClient

from tests.db.test_node_gateway import running_gateway
from tests.helpers import wait_for
from tests.launch_fixtures import run_to_running
from tests.node_helpers import events, fast_thresholds, make_fleet, make_token, simulated_capacity
from tests.submission_setup import add_user, one_local_fleet
from tuneplane.app import db as app_db
from tuneplane.app.db import Database
from tuneplane.app.node_gateway.reports import REPORT_FUNCTIONS
from tuneplane.app.security import new_token
from tuneplane.app.web import create_app
from tuneplane.workers.agent import session as agent_session
from tuneplane.workers.agent.credential import MemoryCredentialStore
from tuneplane.workers.agent.handlers import AgentContext
from tuneplane.workers.agent.session import ControlSession, ReportNotRecorded, enroll

DEMO = {"recipe": {"name": "demo", "params": {"steps": 5}}}

# Test setup: a report kind whose function is a deadlock victim the first `fail` times it runs (a sequence,
# because the failed transactions roll everything else back).
FLAKY = """
CREATE SEQUENCE tuneplane.test_flaky_calls;
CREATE FUNCTION tuneplane.test_flaky_report(p_node_id bigint, p_epoch bigint, p_payload jsonb) RETURNS jsonb
LANGUAGE plpgsql AS $$
BEGIN
    IF nextval('tuneplane.test_flaky_calls') <= (p_payload ->> 'fail')::integer THEN
        RAISE EXCEPTION 'deadlock detected (test)' USING ERRCODE = '40P01';
    END IF;
    RETURN jsonb_build_object('recorded', true);
END $$;
"""


@pytest.fixture
def client(db_url: str, tmp_path: Path) -> FlaskClient:
    app = create_app(db_url, config={"TP_DATA_DIR": str(tmp_path / "data"), "SECRET_KEY": "test"})
    return app.test_client()


def _running_job(db: Database, client: FlaskClient) -> tuple[int, dict]:
    fleet = one_local_fleet(db)
    user = add_user(db, "alice", "user", password="alice-pw")
    plaintext, digest = new_token("tpu")
    db.call("issue_api_token", user, "test", digest, None)
    headers = {"Authorization": f"Bearer {plaintext}", "Accept": "application/json"}
    preview = client.post("/previews", json=DEMO, headers=headers).get_json()
    job_id = client.post(
        f"/previews/{preview['id']}/confirm", json={"digest": preview["digest"]}, headers=headers
    ).get_json()["job_id"]
    db.call("reserve_next", fleet, 1000)
    run_to_running(db, job_id)
    return job_id, headers


def _into_a_deadlock(
    db: Database,
    db_url: str,
    send: Callable[[], Any],
    function: str,
    first: tuple[str, int],
    then: tuple[str, int],
):
    """`send()` (a console request whose stored function is `function`) meets a real deadlock: a second
    session holds the `first` row (table, id) FOR UPDATE, waits until the request waits for it, then asks
    for the `then` row, which the request already holds, and commits. The second session has the longer
    deadlock_timeout, so PostgreSQL picks the request as the victim. Returns the response."""
    answer: dict = {}
    with psycopg.connect(db_url) as blocker:
        blocker.execute("SET deadlock_timeout = '30s'")  # the request (1 s) detects the cycle first
        blocker.execute(f"SELECT 1 FROM tuneplane.{first[0]} WHERE id = %s FOR UPDATE", (first[1],))
        thread = threading.Thread(target=lambda: answer.update(response=send()))
        thread.start()
        wait_for(
            lambda: db.fetch_one(
                "SELECT count(*) AS n FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE %s",
                (f"%{function}%",),
            )["n"],
            what=f"{function} waiting for the {first[0]} row",
        )
        blocker.execute(f"SELECT 1 FROM tuneplane.{then[0]} WHERE id = %s FOR UPDATE", (then[1],))
        blocker.commit()
        thread.join(60)
    return answer["response"]


def _cancel_into_a_deadlock(db: Database, db_url: str, client: FlaskClient, job_id: int, headers: dict):
    # Cancel holds the job row and waits for the attempt; the blocker then asks for the job row: a cycle.
    attempt = db.fetch_one("SELECT id FROM attempts WHERE job_id = %s", (job_id,))["id"]
    return _into_a_deadlock(
        db,
        db_url,
        lambda: client.post(f"/jobs/{job_id}/cancel", json={"reason": "race"}, headers=headers),
        "cancel_job",
        ("attempts", attempt),
        ("jobs", job_id),
    )


def test_a_fence_that_meets_a_deadlock_runs_again_and_is_not_answered_database_unavailable(
    db: Database, db_url: str, client: FlaskClient, caplog: pytest.LogCaptureFixture
) -> None:
    # The fence holds the node's job (lock order: jobs before the node row) and waits for the node row;
    # the blocker then asks for the job. Before, the console answered such a victim 503 "the database is
    # unavailable" and the operator had to fence again.
    job_id, _ = _running_job(db, client)
    node = db.fetch_one("SELECT node_id FROM members WHERE job_id = %s", (job_id,))["node_id"]
    admin = add_user(db, "ops", "admin", password="ops-pw")
    plaintext, digest = new_token("tpu")
    db.call("issue_api_token", admin, "test", digest, None)
    headers = {"Authorization": f"Bearer {plaintext}", "Accept": "application/json"}
    before = db.fetch_one("SELECT deadlocks FROM pg_stat_database WHERE datname = current_database()")
    response = _into_a_deadlock(
        db,
        db_url,
        lambda: client.post("/nodes/fence", json={"node": str(node), "reason": "race"}, headers=headers),
        "fence_node",
        ("nodes", node),
        ("jobs", job_id),
    )
    assert response.status_code == 200, response.get_json()
    assert response.get_json()["members_lost"] == 1
    after = db.fetch_one("SELECT deadlocks FROM pg_stat_database WHERE datname = current_database()")
    assert after["deadlocks"] > before["deadlocks"]  # the race was real
    assert any("fence_node was rolled back" in r.getMessage() for r in caplog.records)


def test_cancel_that_meets_a_deadlock_runs_again_and_succeeds(
    db: Database, db_url: str, client: FlaskClient
) -> None:
    job_id, headers = _running_job(db, client)
    deadlocks = db.fetch_one("SELECT deadlocks FROM pg_stat_database WHERE datname = current_database()")
    response = _cancel_into_a_deadlock(db, db_url, client, job_id, headers)
    assert response.status_code == 200, response.get_data(as_text=True)
    assert "cancel requested by alice: race" in response.get_json()["job"]["state_reason"]
    after = db.fetch_one("SELECT deadlocks FROM pg_stat_database WHERE datname = current_database()")
    assert after["deadlocks"] > deadlocks["deadlocks"]  # the race was real


def test_cancel_that_keeps_meeting_deadlocks_answers_503_saying_so(
    db: Database, db_url: str, client: FlaskClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(app_db, "RETRY_PAUSES", ())  # no second try: the first deadlock is the last
    job_id, headers = _running_job(db, client)
    response = _cancel_into_a_deadlock(db, db_url, client, job_id, headers)
    assert response.status_code == 503, response.get_data(as_text=True)
    error = response.get_json()["error"]
    assert "cancel_job conflicted with concurrent changes 1 times" in error and "40P01" in error
    assert "try again" in error
    assert (
        "cancel requested"
        not in db.fetch_one("SELECT state_reason FROM jobs WHERE id = %s", (job_id,))["state_reason"]
    )


def test_gateway_answers_a_report_it_could_not_record_as_retryable_and_keeps_the_session(
    db_url: str, db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    fast_thresholds(db, heartbeat=0.2, stale=2, lost=4)
    make_fleet(db)
    token = make_token(db)
    with db.transaction() as conn:
        conn.execute(FLAKY)
    monkeypatch.setitem(REPORT_FUNCTIONS, "test.flaky", "test_flaky_report")
    # The agent sends each report once: what gets through is the gateway's own retry.
    monkeypatch.setattr(agent_session, "REPORT_RETRY_PAUSES", ())

    async def scenario() -> None:
        async with running_gateway(db_url) as (_gateway, url), aiohttp.ClientSession() as http:
            store = MemoryCredentialStore(await enroll(http, url, token, "n1"))
            session = ControlSession(
                http, url, store, AgentContext(), simulated_capacity, say=lambda _m: None
            )
            task = asyncio.create_task(session.run())
            await asyncio.wait_for(session.connected.wait(), 10)
            epoch = session.epoch
            # Two deadlocks, then recorded: the gateway ran it again itself (bounded, logged).
            assert await session.report("test.flaky", {"fail": 2}) == {"recorded": True}
            # Deadlocks every time: retryable to the end, and the session is still the same one.
            with pytest.raises(ReportNotRecorded) as failed:
                await session.report("test.flaky", {"fail": 1000})
            assert failed.value.status == 503 and "40P01" in failed.value.message
            # The gateway's database connections are killed: the next report still gets through.
            db.fetch_all(
                "SELECT pg_terminate_backend(pid) AS t FROM pg_stat_activity"
                " WHERE application_name = 'tuneplane-gateway'"
            )
            result = await session.report("note", {"message": "after the connections were killed"})
            assert "event_id" in result
            assert session.epoch == epoch and not task.done()
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    asyncio.run(scenario())
    assert len(events(db, "session_opened")) == 1
    assert events(db, "note")[-1]["reason"] == "after the connections were killed"
