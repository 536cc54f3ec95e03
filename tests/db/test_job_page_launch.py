"""The job page's launch side over HTTP (Flask's test client on a real database): members, attempts, why it
waits with the queue position, logs (JSON, htmx partial, page), cancel with CSRF, and who may see what."""

from __future__ import annotations

import json
import re
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
HTMX = {"HX-Request": "true"}
DEMO = {"recipe": {"name": "demo", "params": {"steps": 5}}}


@pytest.fixture
def app(db_url: str, tmp_path: Path) -> Flask:
    return create_app(db_url, config={"TP_DATA_DIR": str(tmp_path / "data"), "SECRET_KEY": "test"})


@pytest.fixture
def client(app: Flask) -> FlaskClient:
    return app.test_client()


@pytest.fixture
def users(db: Database) -> dict:
    tokens = {"fleet": one_local_fleet(db)}
    for name, role in (("alice", "user"), ("bob", "user"), ("root", "admin")):
        user = add_user(db, name, role, password=f"{name}-pw")
        plaintext, digest = new_token("tpu")
        db.call("issue_api_token", user, "test", digest, None)
        tokens[name] = {"Authorization": f"Bearer {plaintext}", **JSON}
    return tokens


def submit(client: FlaskClient, headers: dict) -> int:
    preview = client.post("/previews", json=DEMO, headers=headers).get_json()
    receipt = client.post(
        f"/previews/{preview['id']}/confirm", json={"digest": preview["digest"]}, headers=headers
    )
    assert receipt.status_code == 201, receipt.get_data(as_text=True)
    return receipt.get_json()["job_id"]


def login(client: FlaskClient, name: str) -> str:
    page = client.get("/login")
    token = re.search(r'name="csrf_token" value="([^"]+)"', page.get_data(as_text=True)).group(1)
    response = client.post("/login", data={"username": name, "password": f"{name}-pw", "csrf_token": token})
    assert response.status_code == 303
    return token


def page_csrf(client: FlaskClient, job_id: int) -> str:
    html = client.get(f"/jobs/{job_id}").get_data(as_text=True)
    return re.search(r'name="csrf_token" value="([^"]+)"', html).group(1)


def start(db: Database, users: dict, job_id: int) -> list[dict]:
    db.call("reserve_next", users["fleet"], 1000)
    return run_to_running(db, job_id)


def ship(db: Database, member: dict, offset: int, text: str, stream: str = "stdout") -> None:
    report(db, "member_log", member, stream=stream, offset=offset, text=text)


def test_queued_job_says_why_it_waits_with_its_queue_position(client: FlaskClient, users: dict) -> None:
    first = submit(client, users["alice"])
    second = submit(client, users["alice"])
    data = client.get(f"/jobs/{second}", headers=users["alice"]).get_json()
    assert data["waiting"]["position"] == 2 and data["waiting"]["ordinal"] == "2nd"
    assert data["waiting"]["head_job_id"] == first and data["waiting"]["queued_in_fleet"] == 2
    assert "2nd in queue" in data["waiting"]["text"] and data["members"] == [] and data["attempts"] == []
    login(client, "alice")
    html = client.get(f"/jobs/{second}").get_data(as_text=True)
    assert "Why it waits:" in html and "2nd in queue" in html and 'id="job-live"' in html
    assert "Cancel job" in html and "No members yet" in html


def test_running_job_shows_members_attempts_and_decision_then_stops_refreshing(
    client: FlaskClient, users: dict, db: Database
) -> None:
    job_id = submit(client, users["alice"])
    (member,) = start(db, users, job_id)
    data = client.get(f"/jobs/{job_id}", headers=users["alice"]).get_json()
    assert data["waiting"] is None and data["terminal"] is False
    (m,) = data["members"]
    assert (m["rank"], m["node"], m["state"], m["exit_code"], m["attempt"]) == (
        0,
        "local-1",
        "running",
        None,
        1,
    )
    (attempt,) = data["attempts"]
    assert attempt["decision"] == "commit" and attempt["state"] == "running"
    login(client, "alice")
    live = client.get(f"/jobs/{job_id}?part=live", headers=HTMX).get_data(as_text=True)
    assert live.startswith('<div id="job-live" hx-get=') and 'hx-trigger="every 2s"' in live
    assert 'id="job-events" hx-swap-oob="true"' in live and "local-1" in live and "commit" in live
    report(db, "member_exited", member, exit_code=0)
    done = client.get(f"/jobs/{job_id}?part=live", headers=HTMX).get_data(as_text=True)
    assert "hx-trigger" not in done.split(">")[0] and "succeeded" in done and "Cancel job" not in done
    assert client.get(f"/jobs/{job_id}?part=bogus").status_code == 400


def test_logs_as_json_htmx_partial_and_page(client: FlaskClient, users: dict, db: Database) -> None:
    job_id = submit(client, users["alice"])
    (member,) = start(db, users, job_id)
    ship(db, member, 0, "epoch 1 <loss=0.5>\n")
    ship(db, member, 19, "epoch 2\n")
    ship(db, member, 0, "Traceback\n", stream="stderr")
    got = client.get(f"/jobs/{job_id}/logs?member=0&stream=stdout&after=0", headers=users["alice"])
    body = got.get_json()
    assert got.status_code == 200 and body["text"] == "epoch 1 <loss=0.5>\nepoch 2\n" and body["next"] == 27
    assert [c["offset"] for c in body["chunks"]] == [0, 19] and body["member_state"] == "running"
    page = client.get(f"/jobs/{job_id}/logs?after=19", headers=users["alice"]).get_json()
    assert page["text"] == "epoch 2\n"
    assert client.get(f"/jobs/{job_id}/logs?stream=stderr", headers=users["alice"]).get_json()["text"] == (
        "Traceback\n"
    )

    login(client, "alice")
    partial = client.get(f"/jobs/{job_id}/logs?member=0&stream=stdout&after=0&tail=262144", headers=HTMX)
    html = partial.get_data(as_text=True)
    assert "epoch 1 &lt;loss=0.5&gt;\nepoch 2\n<div" in html  # escaped, exact, then the poller
    assert 'id="log-0-stdout-poll" hx-swap-oob="true"' in html and "after=27" in html
    assert 'hx-trigger="load delay:2s"' in html
    full = client.get(f"/jobs/{job_id}/logs?member=0").get_data(as_text=True)
    assert '<pre class="log">epoch 1 &lt;loss=0.5&gt;' in full
    job_page = client.get(f"/jobs/{job_id}").get_data(as_text=True)
    assert 'id="log-0-stdout"' in job_page and 'id="log-0-stderr-poll"' in job_page
    # The logs section answers 204 (nothing to swap) while the attempt it shows is still the latest.
    assert client.get(f"/jobs/{job_id}?part=logs&attempt=1", headers=HTMX).status_code == 204
    assert client.get(f"/jobs/{job_id}?part=logs&attempt=0", headers=HTMX).status_code == 200

    report(db, "member_exited", member, exit_code=0)
    ended = client.get(f"/jobs/{job_id}/logs?member=0&after=27", headers=HTMX).get_data(as_text=True)
    assert 'id="log-0-stdout-poll" hx-swap-oob="true"></div>' in ended  # complete: the poller stops


@pytest.mark.parametrize(
    ("query", "status", "field"),
    [
        ("member=x", 400, "member"),
        ("member=-1", 400, "member"),
        ("member=7", 404, "member"),
        ("member=99999999999", 400, "member"),
        ("after=-1", 400, "after"),
        ("after=abc", 400, "after"),
        ("limit=0", 400, "limit"),
        ("limit=99999999", 400, "limit"),
        ("stream=stdin", 400, "stream"),
        ("attempt=3", 404, "attempt"),
        ("tail=-2", 400, "tail"),
    ],
)
def test_bad_log_queries_are_4xx_naming_the_field(
    client: FlaskClient, users: dict, db: Database, query: str, status: int, field: str
) -> None:
    job_id = submit(client, users["alice"])
    start(db, users, job_id)
    response = client.get(f"/jobs/{job_id}/logs?{query}", headers=users["alice"])
    assert response.status_code == status, response.get_data(as_text=True)
    assert field in response.get_json()["fields"]


def test_unknown_job_is_404_naming_the_job(client: FlaskClient, users: dict) -> None:
    for path in ("/jobs/999999/logs", "/jobs/nope/logs"):
        response = client.get(path, headers=users["alice"])
        assert response.status_code == 404 and "job_id" in response.get_json()["fields"]
    cancel = client.post("/jobs/999999/cancel", json={}, headers=users["alice"])
    assert cancel.status_code == 404 and "job_id" in cancel.get_json()["fields"]


def test_another_user_can_neither_see_nor_cancel_a_job(
    client: FlaskClient, users: dict, db: Database
) -> None:
    job_id = submit(client, users["alice"])
    (member,) = start(db, users, job_id)
    ship(db, member, 0, "private\n")
    for path in (f"/jobs/{job_id}", f"/jobs/{job_id}/logs", f"/jobs/{job_id}?part=live"):
        assert client.get(path, headers=users["bob"]).status_code == 404
    refused = client.post(f"/jobs/{job_id}/cancel", json={"reason": "mine now"}, headers=users["bob"])
    assert refused.status_code == 404 and "private" not in refused.get_data(as_text=True)
    assert client.get(f"/jobs/{job_id}", headers=users["alice"]).get_json()["state"] == "running"
    # An admin sees it.
    assert client.get(f"/jobs/{job_id}/logs", headers=users["root"]).get_json()["text"] == "private\n"


def test_cancel_from_the_page_needs_the_csrf_token(client: FlaskClient, users: dict, db: Database) -> None:
    job_id = submit(client, users["alice"])
    login(client, "alice")
    forged = client.post(f"/jobs/{job_id}/cancel", data={"reason": "forged"})
    assert forged.status_code == 403 and "csrf_token" in forged.get_data(as_text=True)
    token = page_csrf(client, job_id)
    done = client.post(f"/jobs/{job_id}/cancel", data={"reason": "wrong data", "csrf_token": token})
    assert done.status_code == 303 and done.headers["Location"].endswith(f"/jobs/{job_id}")
    html = client.get(f"/jobs/{job_id}").get_data(as_text=True)
    assert 'class="state cancelled" id="job-state"' in html and "wrong data" in html
    assert "Cancel job" not in html
    again = client.post(f"/jobs/{job_id}/cancel", data={"csrf_token": token}, headers=JSON)
    assert again.status_code == 409 and again.get_json()["fields"] == {"job": again.get_json()["error"]}


def test_cancel_of_a_running_job_over_the_api_waits_for_the_nodes(
    client: FlaskClient, users: dict, db: Database
) -> None:
    job_id = submit(client, users["alice"])
    (member,) = start(db, users, job_id)
    too_long = client.post(f"/jobs/{job_id}/cancel", json={"reason": "x" * 501}, headers=users["alice"])
    assert too_long.status_code == 400 and "reason" in too_long.get_json()["fields"]
    response = client.post(f"/jobs/{job_id}/cancel", json={"reason": "enough"}, headers=users["alice"])
    assert response.status_code == 200
    job = response.get_json()["job"]
    assert job["state"] == "running" and "waiting for 1 member(s) to stop" in job["state_reason"]
    stop = db.fetch_one("SELECT payload FROM node_commands WHERE kind = 'stop'")["payload"]
    assert stop["member_id"] == member["id"]
    report(db, "member_exited", member, exit_code=-15)
    data = client.get(f"/jobs/{job_id}", headers=users["alice"]).get_json()
    assert data["state"] == "cancelled" and data["members"][0]["state"] == "cancelled"
    assert data["members"][0]["resources_held"] is False
    assert json.dumps(members_of(db, job_id), default=str).count('"released_at": null') == 0


def test_the_page_shows_the_latest_200_events_and_json_has_them_all(
    client: FlaskClient, users: dict, db: Database
) -> None:
    job_id = submit(client, users["alice"])
    with db.transaction() as conn:
        for i in range(210):
            conn.execute("SELECT set_job_state(%s, 'queued', %s)", (job_id, f"placement pass {i}"))
    assert len(client.get(f"/jobs/{job_id}", headers=users["alice"]).get_json()["events"]) == 211
    login(client, "alice")
    html = client.get(f"/jobs/{job_id}").get_data(as_text=True)
    assert "11 earlier events not shown here" in html
    assert "placement pass 209" in html and "placement pass 9<" not in html
