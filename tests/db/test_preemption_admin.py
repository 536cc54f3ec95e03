"""What the user and the admin see of preemption over HTTP (Flask's test client on a real database):
`POST /jobs/<id>/preempt` (`tuneplane jobs preempt JOB [--grace S]`) for installation admins only, the job
page's attempts (resumed from, in its grace, lost GPU-seconds) and its Preemptions section."""

from __future__ import annotations

from pathlib import Path

import pytest
from flask import Flask
from flask.testing import FlaskClient

from tests.launch_fixtures import members_of, report, run_to_running
from tests.submission_setup import add_user, one_local_fleet
from tuneplane.app.db import Database
from tuneplane.app.security import new_token
from tuneplane.app.web import create_app

JSON = {"Accept": "application/json"}
DEMO = {"recipe": {"name": "demo", "params": {"steps": 5}}}


@pytest.fixture
def client(db_url: str, tmp_path: Path) -> FlaskClient:
    app: Flask = create_app(db_url, config={"TP_DATA_DIR": str(tmp_path / "data"), "SECRET_KEY": "test"})
    return app.test_client()


@pytest.fixture
def users(db: Database) -> dict:
    tokens = {"fleet": one_local_fleet(db)}
    for name, role in (("alice", "user"), ("root", "admin")):
        user = add_user(db, name, role, password=f"{name}-pw")
        plaintext, digest = new_token("tpu")
        db.call("issue_api_token", user, "test", digest, None)
        tokens[name] = {"Authorization": f"Bearer {plaintext}", **JSON}
    return tokens


def running(db: Database, client: FlaskClient, headers: dict) -> int:
    preview = client.post("/previews", json=DEMO, headers=headers).get_json()
    receipt = client.post(
        f"/previews/{preview['id']}/confirm", json={"digest": preview["digest"]}, headers=headers
    )
    job_id = receipt.get_json()["job_id"]
    db.call("reserve_next", preview["resolved"]["fleet"]["id"], 1000)
    run_to_running(db, job_id)
    return job_id


def test_an_admin_preempts_a_job_and_its_page_shows_the_grace_then_the_outcome(
    db: Database, client: FlaskClient, users: dict
) -> None:
    job_id = running(db, client, users["alice"])
    refused = client.post(f"/jobs/{job_id}/preempt", json={}, headers=users["alice"])
    assert refused.status_code == 403 and refused.get_json()["fields"] == {
        "actor": refused.get_json()["error"]
    }
    bad = client.post(f"/jobs/{job_id}/preempt", json={"grace": "soon"}, headers=users["root"])
    assert bad.status_code == 422 and "grace" in bad.get_json()["fields"]
    answer = client.post(f"/jobs/{job_id}/preempt", json={"grace": 30}, headers=users["root"])
    assert answer.status_code == 200, answer.get_data(as_text=True)
    attempt = answer.get_json()["attempt"]
    assert attempt["stop_kind"] == "preempted"
    assert attempt["stop_cause"] == "preempted by an admin (user root)"  # not "by admin root" (issue 35)

    page = client.get(f"/jobs/{job_id}", headers=users["alice"]).get_json()
    (shown,) = page["attempts"]
    assert shown["preemption"]["in_grace"] is True
    # The Fleet page lists the jobs in their grace.
    fleet = client.get("/fleets", headers=users["root"]).get_json()
    assert [(g["job_id"], g["stop_kind"]) for g in fleet["in_grace"]] == [(job_id, "preempted")]
    html = client.get("/fleets", headers={"Authorization": users["root"]["Authorization"]}).get_data(
        as_text=True
    )
    assert "In their grace" in html and f"job {job_id}" in html
    (decision,) = page["preemptions"]
    assert decision["rule"] == "admin" and decision["role"] == "victim"
    assert decision["victims"][0]["job_id"] == job_id

    report(db, "member_exited", members_of(db, job_id)[0], exit_code=0)
    page = client.get(f"/jobs/{job_id}", headers=users["alice"]).get_json()
    (shown,) = page["attempts"]
    assert shown["state"] == "preempted" and shown["preemption"]["in_grace"] is False
    assert shown["preemption"]["lost_gpu_seconds"] is not None  # a simulated GPU job: GPUs × time lost
    assert page["state"] == "queued"  # a preemption does not spend its one attempt
    html = client.get(f"/jobs/{job_id}", headers={"Authorization": users["alice"]["Authorization"]})
    text = html.get_data(as_text=True)
    assert "Preemptions" in text and "preempted by an admin (user root)" in text
