"""Teams at preview and scoped API tokens over HTTP (docs/teams.md): a job goes to the team the spec names
(or the user's default team); viewers and outsiders cannot submit into a team; a read-only token cannot
preview, confirm or cancel; a team-scoped token reaches only its teams and never makes a wider token."""

from __future__ import annotations

from pathlib import Path

import pytest
from flask import Flask
from flask.testing import FlaskClient

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


def _bearer(
    db: Database, user: int, read_only: bool = False, teams: list[str] | None = None, name: str = "test"
) -> dict:
    plaintext, digest = new_token("tpu")
    db.call("issue_scoped_api_token", user, name, digest, None, teams or [], read_only)
    return {"Authorization": f"Bearer {plaintext}", **JSON}


@pytest.fixture
def crew(db: Database) -> dict:
    one_local_fleet(db)
    ids = {
        name: add_user(db, name, "user", password=f"{name}-pw") for name in ("alice", "bob", "carol", "dave")
    }
    vision = db.call("create_team", ids["alice"], "vision")[0]["id"]
    db.call("set_team_member", ids["alice"], vision, ids["bob"], "member")
    db.call("set_team_member", ids["alice"], vision, ids["carol"], "viewer")
    return {"ids": ids, "vision": vision, **{n: _bearer(db, i) for n, i in ids.items()}}


def _preview(client: FlaskClient, headers: dict, **spec) -> object:
    return client.post("/previews", json={**DEMO, **spec}, headers=headers)


def _submit(client: FlaskClient, headers: dict, key: str, **spec) -> dict:
    body = _preview(client, headers, **spec).get_json()
    confirm = client.post(
        f"/previews/{body['id']}/confirm", json={"digest": body["digest"], "retry_key": key}, headers=headers
    )
    assert confirm.status_code == 201, confirm.get_json()
    return confirm.get_json()


def test_a_job_belongs_to_the_named_team_or_the_users_personal_team(
    client: FlaskClient, crew: dict, db: Database
) -> None:
    mine = _submit(client, crew["bob"], "k1")
    theirs = _submit(client, crew["bob"], "k2", team="vision")
    teams = {
        r["id"]: r["team"]
        for r in db.fetch_all("SELECT j.id, t.name AS team FROM jobs j JOIN teams t ON t.id = j.team_id")
    }
    assert teams[mine["job_id"]] == "bob" and teams[theirs["job_id"]] == "vision"
    summary = _preview(client, crew["bob"], team="vision", preemptible=True).get_json()["summary"]
    assert summary["team"] == "vision"
    assert summary["preemption"].startswith("preemptible: may borrow idle GPUs above the team's guarantee")


def test_viewers_and_outsiders_cannot_submit_into_a_team(
    client: FlaskClient, crew: dict, db: Database
) -> None:
    viewer = _preview(client, crew["carol"], team="vision")
    assert viewer.status_code == 403 and viewer.get_json()["fields"] == {
        "team": "you are a viewer of team vision: viewers cannot submit"
    }
    outsider = _preview(client, crew["dave"], team="vision")
    assert outsider.status_code == 404 and "no team vision of yours" in outsider.get_json()["error"]
    assert db.fetch_one("SELECT count(*) AS n FROM previews WHERE team_id = %s", (crew["vision"],))["n"] == 0


def test_a_member_removed_after_the_preview_cannot_confirm_it(
    client: FlaskClient, crew: dict, db: Database
) -> None:
    body = _preview(client, crew["bob"], team="vision").get_json()
    db.call("set_team_member", crew["ids"]["alice"], crew["vision"], crew["ids"]["bob"], None)
    confirm = client.post(
        f"/previews/{body['id']}/confirm",
        json={"digest": body["digest"], "retry_key": "k"},
        headers=crew["bob"],
    )
    assert confirm.status_code == 404 and confirm.get_json()["fields"]["team"] == "no team vision of yours"


def test_a_listed_fleet_refuses_teams_it_does_not_list(client: FlaskClient, crew: dict, db: Database) -> None:
    db.fetch_all("UPDATE fleets SET team_access = 'listed' RETURNING id")
    refused = _preview(client, crew["bob"], team="vision")
    assert refused.status_code == 403 and refused.get_json()["fields"]["fleet"].startswith(
        "team vision may not use fleet local"
    )
    db.fetch_all(
        "INSERT INTO fleet_team_access (fleet_id, team_id) SELECT id, %s FROM fleets RETURNING 1",
        (crew["vision"],),
    )
    assert _preview(client, crew["bob"], team="vision").status_code == 201


def test_a_read_only_token_cannot_preview_confirm_or_cancel(
    client: FlaskClient, crew: dict, db: Database
) -> None:
    receipt = _submit(client, crew["bob"], "k1", team="vision")
    body = _preview(client, crew["bob"], team="vision").get_json()
    read_only = _bearer(db, crew["ids"]["bob"], read_only=True)
    refused = _preview(client, read_only, team="vision")
    assert refused.status_code == 403 and "read-only" in refused.get_json()["fields"]["team"]
    confirm = client.post(
        f"/previews/{body['id']}/confirm",
        json={"digest": body["digest"], "retry_key": "k9"},
        headers=read_only,
    )
    assert confirm.status_code == 403
    cancel = client.post(f"/jobs/{receipt['job_id']}/cancel", json={}, headers=read_only)
    assert cancel.status_code == 403 and "may only read" in cancel.get_json()["error"]
    assert db.fetch_one("SELECT state FROM jobs WHERE id = %s", (receipt["job_id"],))["state"] == "queued"
    assert client.get(f"/jobs/{receipt['job_id']}", headers=read_only).status_code == 200  # it may read
    made = client.post("/tokens", json={"name": "wider"}, headers=read_only)
    assert made.status_code == 403


def test_a_team_scoped_token_reaches_only_its_teams_and_makes_no_wider_token(
    client: FlaskClient, crew: dict, db: Database
) -> None:
    scoped = _bearer(db, crew["ids"]["bob"], teams=["vision"], name="scoped")
    assert _preview(client, scoped, team="vision").status_code == 201
    personal = _preview(client, scoped, team="bob")
    assert personal.status_code == 403 and "may not submit to team bob" in personal.get_json()["error"]
    assert client.post("/tokens", json={"name": "all"}, headers=scoped).status_code == 403
    narrower = client.post(
        "/tokens", json={"name": "ro", "teams": ["vision"], "read_only": True}, headers=scoped
    )
    assert narrower.status_code == 201 and narrower.get_json()["read_only"] is True
    listed = {t["name"]: t for t in client.get("/tokens", headers=scoped).get_json()}
    assert listed["ro"]["teams"] == ["vision"] and listed["ro"]["read_only"] is True
    assert listed["scoped"]["last_used_at"] is not None
    revoked = client.post(f"/tokens/{listed['ro']['id']}/revoke", json={}, headers=scoped)
    assert revoked.status_code == 200
    stranger = client.post(f"/tokens/{listed['ro']['id']}/revoke", json={}, headers=crew["dave"])
    assert stranger.status_code == 404


def test_a_team_scoped_token_cannot_create_a_team(client: FlaskClient, crew: dict, db: Database) -> None:
    scoped = _bearer(db, crew["ids"]["bob"], teams=["vision"], name="scoped")
    refused = client.post("/teams", json={"name": "escape"}, headers=scoped)
    assert refused.status_code == 403 and refused.get_json()["fields"].keys() == {"token"}
    assert db.fetch_one("SELECT count(*) AS n FROM teams WHERE name = 'escape'")["n"] == 0
    assert client.post("/teams", json={"name": "escape"}, headers=crew["bob"]).status_code == 201


@pytest.mark.parametrize(
    ("ttl", "said"),
    [
        ("0s", "between 1m and 365d"),
        ("0", "unit"),
        ("30s", "between 1m and 365d"),
        (" ", "blank"),
        ("", "blank"),
        ("7 d", "unit"),
        ("７d", "unit"),
        ("366d", "between 1m and 365d"),
        ("-1h", "unit"),
        (3600, "string"),
    ],
)
def test_a_token_ttl_is_a_positive_ascii_duration_within_the_range(
    client: FlaskClient, crew: dict, db: Database, ttl: object, said: str
) -> None:
    refused = client.post("/tokens", json={"name": "t", "ttl": ttl}, headers=crew["alice"])
    assert refused.status_code == 400 and refused.get_json()["fields"].keys() == {"ttl"}, refused.get_json()
    assert said in refused.get_json()["error"]
    assert db.fetch_one("SELECT count(*) AS n FROM api_tokens WHERE name = 't'")["n"] == 0


def test_a_token_ttl_in_range_expires_and_no_ttl_never_does(client: FlaskClient, crew: dict) -> None:
    made = client.post("/tokens", json={"name": "t", "ttl": "1m"}, headers=crew["alice"])
    assert made.status_code == 201 and made.get_json()["expires_at"] is not None
    made = client.post("/tokens", json={"name": "u", "ttl": "365d"}, headers=crew["alice"])
    assert made.status_code == 201
    forever = client.post("/tokens", json={"name": "v"}, headers=crew["alice"])
    assert forever.status_code == 201 and forever.get_json()["expires_at"] is None


def test_a_token_name_with_a_control_character_or_an_unknown_field_is_refused(
    client: FlaskClient, crew: dict
) -> None:
    for name in ("bad\nname", "bell\x07", "esc\x1b[31m"):
        refused = client.post("/tokens", json={"name": name}, headers=crew["alice"])
        assert refused.status_code == 400 and "name" in refused.get_json()["fields"]
    unknown = client.post("/tokens", json={"name": "ok", "expires": "1d"}, headers=crew["alice"])
    assert unknown.status_code == 400 and unknown.get_json()["fields"] == {"expires": "unknown field"}


def test_the_configured_maximum_ttl_bounds_a_token(
    client: FlaskClient, crew: dict, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TUNEPLANE_API_TOKEN_MAX_TTL", "7d")
    refused = client.post("/tokens", json={"name": "t", "ttl": "8d"}, headers=crew["alice"])
    assert refused.status_code == 400 and "between 1m and 7d" in refused.get_json()["error"]
    assert client.post("/tokens", json={"name": "t", "ttl": "7d"}, headers=crew["alice"]).status_code == 201


def test_a_team_scoped_token_creates_no_team_by_the_one_write_rule(
    client: FlaskClient, crew: dict, db: Database
) -> None:
    """A new team belongs to none of the token's teams: creating one is an installation-wide change
    (require_token_write's reach `installation`, docs/teams.md), refused in that rule's words, not by a
    second copy of the scope check written inside create_team."""
    scoped = _bearer(db, crew["ids"]["alice"], teams=["vision"], name="scoped")
    refused = client.post("/teams", json={"name": "robotics"}, headers=scoped)
    assert refused.status_code == 403, refused.get_json()
    assert refused.get_json()["fields"]["token"].startswith(
        "this API token is scoped to teams: creating a team is an installation-wide change"
    )
    assert db.fetch_one("SELECT count(*) AS n FROM teams WHERE name = 'robotics'")["n"] == 0
    created = client.post("/teams", json={"name": "robotics"}, headers=crew["alice"])
    assert created.status_code in (200, 201), created.get_json()
