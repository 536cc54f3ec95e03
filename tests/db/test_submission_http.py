"""The HTTP forms are the API: HTML for browsers, JSON for `Accept: application/json`, 4xx naming fields."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from flask import Flask
from flask.testing import FlaskClient

from tests import archive_builders as ab
from tests.submission_setup import add_user, one_local_fleet
from tuneplane.app.db import Database
from tuneplane.app.security import new_token
from tuneplane.app.web import create_app

JSON = {"Accept": "application/json"}
DEMO = {"recipe": {"name": "demo", "params": {"steps": 5}}}


@pytest.fixture
def app(db_url: str, tmp_path: Path) -> Flask:
    return create_app(db_url, config={"TP_DATA_DIR": str(tmp_path / "data"), "SECRET_KEY": "test"})


@pytest.fixture
def client(app: Flask) -> FlaskClient:
    return app.test_client()


@pytest.fixture
def users(db: Database) -> dict:
    one_local_fleet(db)
    tokens = {}
    for name, role in (("alice", "user"), ("bob", "user"), ("root", "admin")):
        user = add_user(db, name, role, password=f"{name}-pw")
        plaintext, digest = new_token("tpu")
        db.call("issue_api_token", user, "test", digest, None)
        tokens[name] = {"Authorization": f"Bearer {plaintext}", **JSON}
    return tokens


def login(client: FlaskClient, name: str) -> str:
    page = client.get("/login")
    token = re.search(r'name="csrf_token" value="([^"]+)"', page.get_data(as_text=True)).group(1)
    response = client.post("/login", data={"username": name, "password": f"{name}-pw", "csrf_token": token})
    assert response.status_code == 303
    home = client.get("/submit").get_data(as_text=True)
    return re.search(r'name="csrf_token" value="([^"]+)"', home).group(1)


def test_preview_and_confirm_as_json_with_an_api_token(client: FlaskClient, users: dict) -> None:
    preview = client.post("/previews", json=DEMO, headers=users["alice"])
    assert preview.status_code == 201
    body = preview.get_json()
    assert body["summary"]["fleet"].startswith("local") and len(body["digest"]) == 64
    confirm = {"digest": body["digest"], "retry_key": "k1"}
    first = client.post(f"/previews/{body['id']}/confirm", json=confirm, headers=users["alice"])
    again = client.post(f"/previews/{body['id']}/confirm", json=confirm, headers=users["alice"])
    assert first.status_code == 201 and again.status_code == 200
    assert first.get_json()["job_id"] == again.get_json()["job_id"]
    assert first.get_json()["state"] == "queued"


def test_bad_jobspec_fields_are_named_in_json(client: FlaskClient, users: dict) -> None:
    bad = {
        "recipe": {"name": "demo"},
        "resources": {"gpus_per_node": -1, "memory_per_node": "lots"},
        "bogus": 1,
    }
    response = client.post("/previews", json=bad, headers=users["alice"])
    assert response.status_code == 422
    fields = response.get_json()["fields"]
    assert {"resources.gpus_per_node", "resources.memory_per_node", "bogus"} <= set(fields)
    assert fields["bogus"] == "unknown field"
    two = client.post(
        "/previews", json={**DEMO, "image": {"ref": "x", "command": "y"}}, headers=users["alice"]
    )
    assert two.status_code == 422 and "exactly one input" in two.get_json()["error"]


def test_bad_jobspec_fields_are_named_in_html_and_htmx(client: FlaskClient, users: dict) -> None:
    csrf = login(client, "alice")
    form = {
        "csrf_token": csrf,
        "input_kind": "recipe",
        "recipe.name": "demo",
        "resources.nodes": "0",
        "retry_key": "dialog-x",
    }
    page = client.post("/previews", data=form)
    assert page.status_code == 422 and "text/html" in page.content_type
    html = page.get_data(as_text=True)
    assert "resources.nodes" in html and 'id="submit-form"' in html  # the dialog again, with the field named
    partial = client.post("/previews", data=form, headers={"HX-Request": "true"})
    text = partial.get_data(as_text=True)
    assert partial.status_code == 422 and 'data-field="resources.nodes"' in text and "<html" not in text


def test_console_dialog_preview_confirm_lands_on_the_job_page(client: FlaskClient, users: dict) -> None:
    csrf = login(client, "alice")
    dialog = client.get("/submit").get_data(as_text=True)
    retry_key = re.search(r'name="retry_key" value="([^"]+)"', dialog).group(1)
    form = {
        "csrf_token": csrf,
        "input_kind": "recipe",
        "recipe.name": "demo",
        "recipe.params": "steps=7\n",
        "resources.memory_per_node": "1G",
        "retry_key": retry_key,
    }
    partial = client.post("/previews", data=form, headers={"HX-Request": "true"})
    assert partial.status_code == 201
    text = partial.get_data(as_text=True)
    preview_id = re.search(r'data-preview-id="([^"]+)"', text).group(1)
    digest = re.search(r'name="digest" value="([0-9a-f]{64})"', text).group(1)
    assert f'name="retry_key" value="{retry_key}"' in text and "local" in text
    confirm = {"csrf_token": csrf, "digest": digest, "retry_key": retry_key}
    first = client.post(f"/previews/{preview_id}/confirm", data=confirm, headers={"HX-Request": "true"})
    double = client.post(f"/previews/{preview_id}/confirm", data=confirm)  # a resubmitted form
    assert first.headers["HX-Redirect"] == double.headers["Location"]
    job_page = client.get(first.headers["HX-Redirect"])
    html = job_page.get_data(as_text=True)
    assert job_page.status_code == 200 and "waiting for resources" in html and "queued" in html
    assert client.get("/jobs", headers=JSON).get_json()["jobs"][0]["retry_key"] == retry_key


def test_dialog_environment_fields_reach_the_lock_and_a_bad_package_is_named(
    client: FlaskClient, users: dict
) -> None:
    csrf = login(client, "alice")
    dialog = client.get("/submit").get_data(as_text=True)
    assert 'name="environment.packages"' in dialog and 'name="environment.base"' in dialog
    gzip = {**users["alice"], "Content-Type": "application/gzip"}
    up = client.post("/sources", data=ab.honest(), headers=gzip)
    form = {
        "csrf_token": csrf,
        "input_kind": "source",
        "source.archive": up.get_json()["archive"],
        "source.entrypoint": "python train.py",
        "environment.packages": "six==1.16.0\n\n  tqdm \n",
        "environment.base": "isolated",
        "retry_key": "env-dialog",
    }
    partial = client.post("/previews", data=form, headers={"HX-Request": "true"})
    text = partial.get_data(as_text=True)
    assert partial.status_code == 201, text
    assert "six 1.16.0" in text and "tqdm" in text  # the summary's runtime line names the lock
    bad = client.post(
        "/previews", data={**form, "environment.packages": "-e ."}, headers={"HX-Request": "true"}
    )
    assert bad.status_code == 422 and 'data-field="environment.packages' in bad.get_data(as_text=True)


def test_forms_need_the_csrf_token_and_bearer_requests_do_not(client: FlaskClient, users: dict) -> None:
    csrf = login(client, "alice")
    form = {"input_kind": "recipe", "recipe.name": "demo"}
    missing = client.post("/previews", data=form, headers=JSON)
    assert missing.status_code == 403 and missing.get_json()["fields"] == {
        "csrf_token": missing.get_json()["error"]
    }
    wrong = client.post("/previews", data={**form, "csrf_token": "nope"})
    assert wrong.status_code == 403
    assert client.post("/previews", data=form, headers={"X-CSRF-Token": csrf, **JSON}).status_code == 201
    assert client.post("/logout").status_code == 403
    fresh = create_app_client(client)
    assert fresh.post("/previews", json=DEMO, headers=users["bob"]).status_code == 201


def create_app_client(client: FlaskClient) -> FlaskClient:
    return client.application.test_client()


def test_login_refuses_wrong_passwords_and_logout_ends_the_session(client: FlaskClient, users: dict) -> None:
    page = client.get("/login").get_data(as_text=True)
    token = re.search(r'name="csrf_token" value="([^"]+)"', page).group(1)
    bad = client.post("/login", data={"username": "alice", "password": "nope", "csrf_token": token})
    assert bad.status_code == 401 and "wrong username or password" in bad.get_data(as_text=True)
    assert client.get("/submit").status_code == 302  # not logged in: to the login page
    csrf = login(client, "alice")
    assert client.get("/submit").status_code == 200
    assert client.post("/logout", data={"csrf_token": csrf}).status_code == 303
    assert client.get("/jobs", headers=JSON).status_code == 401


def test_login_redirect_never_leaves_the_site(client: FlaskClient, users: dict) -> None:
    page = client.get("/login").get_data(as_text=True)
    token = re.search(r'name="csrf_token" value="([^"]+)"', page).group(1)
    response = client.post(
        "/login",
        data={
            "username": "alice",
            "password": "alice-pw",
            "csrf_token": token,
            "next": "https://evil.example/",
        },
    )
    assert response.headers["Location"] == "/"


def test_api_token_endpoint_takes_json_only_and_checks_the_password(client: FlaskClient, users: dict) -> None:
    assert client.post("/api/tokens", data={"username": "alice", "password": "alice-pw"}).status_code == 415
    wrong = client.post("/api/tokens", json={"username": "alice", "password": "x"})
    assert wrong.status_code == 401 and wrong.get_json()["fields"]["password"]
    issued = client.post("/api/tokens", json={"username": "alice", "password": "alice-pw"})
    assert issued.status_code == 201
    token = issued.get_json()["token"]
    mine = client.get("/jobs", headers={"Authorization": f"Bearer {token}", **JSON})
    assert mine.status_code == 200 and mine.get_json()["jobs"] == []


def test_users_see_their_own_jobs_and_admins_all(client: FlaskClient, users: dict) -> None:
    ids = {}
    for name in ("alice", "bob"):
        preview = client.post("/previews", json=DEMO, headers=users[name]).get_json()
        receipt = client.post(
            f"/previews/{preview['id']}/confirm",
            json={"digest": preview["digest"], "retry_key": "k"},
            headers=users[name],
        )
        ids[name] = receipt.get_json()["job_id"]
    alice_jobs = client.get("/jobs", headers=users["alice"]).get_json()["jobs"]
    assert [j["id"] for j in alice_jobs] == [ids["alice"]]
    assert {j["id"] for j in client.get("/jobs", headers=users["root"]).get_json()["jobs"]} == set(
        ids.values()
    )
    assert client.get(f"/jobs/{ids['bob']}", headers=users["alice"]).status_code == 404
    assert client.get(f"/jobs/{ids['bob']}", headers=users["root"]).get_json()["owner"] == "bob"
    job = client.get(f"/jobs/{ids['alice']}", headers=users["alice"]).get_json()
    assert job["events"][0]["to_state"] == "queued" and job["spec"]["fleet"]["name"] == "local"


def test_nav_shows_jobs_and_submit(client: FlaskClient, users: dict) -> None:
    login(client, "alice")
    html = client.get("/jobs").get_data(as_text=True)
    assert 'href="/jobs"' in html and 'href="/submit"' in html


@pytest.mark.parametrize(
    ("name", "build", "reason"),
    [
        ("dotdot", ab.dotdot, "'..' component"),
        ("absolute", ab.absolute, "absolute path"),
        ("symlink", ab.symlink_escape, "points outside the archive"),
        ("device", ab.device_file, "device file"),
        ("many", ab.many_tiny_files, "more than 5000 members"),
    ],
)
def test_archive_attacks_are_refused_over_http_and_nothing_is_stored(
    client: FlaskClient, users: dict, db: Database, app: Flask, name: str, build, reason: str
) -> None:
    response = client.post(
        "/sources", data=build(), headers={**users["alice"], "Content-Type": "application/gzip"}
    )
    assert response.status_code == 422 and reason in response.get_json()["error"], name
    assert response.get_json()["fields"].keys() == {"archive"}
    assert_nothing_stored(db, app)


def test_zip_bomb_is_refused_and_nothing_is_stored(
    client: FlaskClient, users: dict, db: Database, app: Flask
) -> None:
    root = db.fetch_one("SELECT id FROM users WHERE username = 'root'")["id"]
    db.call("set_submission_setting", root, "archive_max_unpacked_bytes", 1024 * 1024)
    data = ab.bomb(32 * 1024 * 1024)
    assert len(data) < 64 * 1024
    response = client.post(
        "/sources", data=data, headers={**users["alice"], "Content-Type": "application/gzip"}
    )
    assert (
        response.status_code == 422 and "expands to more than 1048576 bytes" in response.get_json()["error"]
    )
    assert_nothing_stored(db, app)


def test_oversized_upload_is_a_413(client: FlaskClient, users: dict, db: Database, app: Flask) -> None:
    root = db.fetch_one("SELECT id FROM users WHERE username = 'root'")["id"]
    db.call("set_submission_setting", root, "archive_max_bytes", 1000)
    gzip = {**users["alice"], "Content-Type": "application/gzip"}
    response = client.post("/sources", data=ab.many_tiny_files(200), headers=gzip)
    assert response.status_code == 413
    assert_nothing_stored(db, app)


def assert_nothing_stored(db: Database, app: Flask) -> None:
    assert db.fetch_one("SELECT count(*) AS n FROM source_archives")["n"] == 0
    store_root = Path(app.config["TP_DATA_DIR"]) / "blobs"
    leftovers = [p for p in store_root.rglob("*") if p.is_file()] if store_root.exists() else []
    assert leftovers == []


def test_source_upload_then_preview_pins_the_archive(client: FlaskClient, users: dict, app: Flask) -> None:
    data = ab.honest()
    up = client.post("/sources", data=data, headers={**users["alice"], "Content-Type": "application/gzip"})
    assert up.status_code == 201
    facts = up.get_json()
    blob = Path(app.config["TP_DATA_DIR"]) / "blobs" / "sha256" / facts["sha256"][:2] / facts["sha256"]
    assert blob.read_bytes() == data
    again = client.post("/sources", data=data, headers={**users["alice"], "Content-Type": "application/gzip"})
    assert again.get_json()["sha256"] == facts["sha256"]
    spec = {"source": {"archive": facts["archive"], "entrypoint": "python train.py"}}
    preview = client.post("/previews", json=spec, headers=users["alice"])
    assert (
        preview.status_code == 201 and preview.get_json()["resolved"]["input"]["archive"]["member_count"] == 3
    )
    assert client.post("/previews", json=spec, headers=users["bob"]).status_code == 404


GARBAGE = [
    ("post", "/previews", {"data": b"{not json", "headers": {"Content-Type": "application/json"}}),
    ("post", "/previews", {"json": [1, 2]}),
    ("post", "/previews", {"json": {"recipe": {"name": "demo", "params": {"steps": 10**30}}}}),
    ("post", "/previews", {"json": {"recipe": {"name": "demo", "params": {"steps": {"a": 1}}}}}),
    ("post", "/previews", {"json": {"recipe": {"name": "demo"}, "resources": {"nodes": 10**20}}}),
    ("post", "/previews", {"json": {"recipe": {"name": "demo"}, "env": {"A": 1}}}),
    ("post", "/previews", {"json": {"recipe": {"name": "demo"}, "priority": "highest"}}),  # no such class
    ("post", "/previews", {"json": {"recipe": {"name": "demo"}, "priority": 1.5}}),
    ("post", "/previews", {"json": {"source": {"archive": "sha256:" + "0" * 64, "entrypoint": "x"}}}),
    ("post", "/previews", {"json": {"image": {"ref": "UPPER/Case:tag", "command": "x"}}}),
    ("post", "/previews", {"data": {"input_kind": "teleport"}}),
    ("post", "/previews", {"data": {"input_kind": "recipe", "recipe.name": "demo", "env": "no-equals"}}),
    ("get", "/previews/not-a-uuid", {}),
    ("get", "/previews/00000000-0000-0000-0000-000000000000", {}),
    ("post", "/previews/not-a-uuid/confirm", {"json": {"digest": "x", "retry_key": "k"}}),
    ("post", "/previews/00000000-0000-0000-0000-000000000000/confirm", {"json": {"digest": 5}}),
    ("post", "/previews/00000000-0000-0000-0000-000000000000/confirm", {"json": "str"}),
    ("get", "/jobs/99999999999999999999999", {}),
    ("get", "/jobs/abc", {}),
    ("get", "/jobs?limit=x", {}),
    ("get", "/jobs?state=sleeping", {}),
    ("get", "/jobs?before=-1", {}),
    ("post", "/sources", {"data": b""}),
    ("post", "/sources", {"data": b"\x1f\x8b garbage"}),
]


@pytest.mark.parametrize(("method", "path", "kwargs"), GARBAGE)
def test_garbage_requests_get_a_4xx_never_a_500(
    client: FlaskClient, users: dict, method: str, path: str, kwargs: dict
) -> None:
    headers = {**users["alice"], **kwargs.pop("headers", {})}
    response = getattr(client, method)(path, headers=headers, **kwargs)
    assert 400 <= response.status_code < 500, (response.status_code, response.get_data(as_text=True)[:300])
    assert "error" in response.get_json()


def test_an_upload_for_a_fleet_needs_a_team_that_may_use_it(
    client: FlaskClient, users: dict, db: Database, app: Flask
) -> None:
    """`POST /sources?fleet=` keeps the archive in that fleet's store (an S3 bucket, issue 32): nobody without
    a team admitted to the fleet may put bytes there. Refused before a byte is stored."""
    root = db.fetch_one("SELECT id FROM users WHERE username = 'root'")["id"]
    db.call("set_fleet_access_mode", root, "local", "listed")
    gzip = {**users["alice"], "Content-Type": "application/gzip"}
    refused = client.post("/sources?fleet=local", data=ab.honest(), headers=gzip)
    assert refused.status_code == 403, refused.get_data(as_text=True)
    assert refused.get_json()["fields"].keys() == {"fleet"}
    assert "none of your teams may submit to fleet local" in refused.get_json()["error"]
    unknown = client.post("/sources?fleet=nowhere", data=ab.honest(), headers=gzip)
    assert unknown.status_code == 404 and unknown.get_json()["fields"].keys() == {"fleet"}
    assert_nothing_stored(db, app)
    # The admin may; so may alice once her team is granted the fleet.
    as_root = {**users["root"], "Content-Type": "application/gzip"}
    admin = client.post("/sources?fleet=local", data=ab.honest(), headers=as_root)
    assert admin.status_code == 201
    db.call("set_fleet_team_access", root, "local", "alice", True, None)
    assert client.post("/sources?fleet=local", data=ab.honest(), headers=gzip).status_code == 201
