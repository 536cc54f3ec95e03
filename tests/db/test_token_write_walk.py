"""Read-only means read-only everywhere (issue 34): every registered console route with a write method,
walked with tokens that may not write there, must change nothing.

The rule is require_token_write (sql/functions/teams.sql), asked by require_admin, require_installation_admin,
the team-admin checks, create_team, source uploads and (as token_scope_allows) every job `act`. Walks:
  * a read-only token of an installation admin, and of a team admin (not an installation admin);
  * a token scoped to another team of each of them, aimed at the team it does not reach (and at
    installation-wide changes, which a team-scoped token never makes).
Any write that succeeds (a status below 400) fails the test. A last walk with the installation admin's
full token is answered on every route, so the refusals above are the token's and not a bad URL or body.
A new write route must be given a body here (WRITES) or a reason (NOT_WALKED), so none is forgotten.
"""

from __future__ import annotations

import gzip
import io
import tarfile
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
NODE = "a node credential's route: a user's token is not a node credential"
# Write routes not walked, with the reason.
NOT_WALKED = {
    "/login": "logs in with a password, no token",
    "/logout": "ends the console session, no token",
    "/api/tokens": "issues a token to whoever logs in with a password (no token is asked)",
    "/artifacts/<int:artifact_id>/verify": "reads the stored files against the manifest (a read by POST)",
    "/api/artifacts": NODE,
    "/api/artifacts/refused": NODE,
    "/api/artifacts/<int:artifact_id>/files/<int:file_index>/chunks/<int:chunk_index>": NODE,
    "/api/artifacts/<int:artifact_id>/finish": NODE,
    "/api/artifacts/<int:artifact_id>/fail": NODE,
    "/api/input-artifacts/<int:artifact_id>/files/<int:file_index>/mismatch": NODE,
}
# Not walked with a team-scoped token, with the reason (the read-only walk still covers them).
NOT_SCOPED = {
    "/sources": "an upload is the uploader's, of no team (the preview that names it is checked)",
    "/tokens/<int:token_id>/revoke": "the caller's own token, of no team",
}
# The full token's own answer, where it is not a success, with the reason (still past the access checks).
CONTROL = {
    "/jobs/<job_id>/preempt": (409, "the job is queued, not running: nothing to preempt"),
    "/jobs/<int:job_id>/checkpoints": (409, "the job has no running member to ask"),
}


def _archive() -> bytes:
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w") as tar:
        data = b"print('hi')\n"
        info = tarfile.TarInfo("train.py")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    return gzip.compress(raw.getvalue())


def _writes(world: dict) -> dict:
    """Each write route: (path, body). The body is what a real client sends, so only the token refuses."""
    job, team = world["job_id"], "vision"
    return {
        "/fleets": ("/fleets", {"name": "walked-fleet"}),
        "/fleets/<name>/enrollment-tokens": ("/fleets/local/enrollment-tokens", {}),
        "/nodes/fence": ("/nodes/fence", {"node": "local-1", "action": "fence", "reason": "walk"}),
        "/nodes/scheduling": ("/nodes/scheduling", {"node": "local-1", "action": "cordon", "reason": "walk"}),
        "/usage/prices": ("/usage/prices", {"fleet": "local", "price": "1.5"}),
        "/fleets/<name>/access": ("/fleets/local/access", {"mode": "listed"}),
        "/fleets/<name>/team-access": ("/fleets/local/team-access", {"team": team, "slurm_account": "acct"}),
        "/fleets/<name>/idle-policy": ("/fleets/local/idle-policy", {"idle_after": "30m", "action": "warn"}),
        "/teams/<name>/priority": (f"/teams/{team}/priority", {"max_class": "high", "fleet": ""}),
        "/jobs/<job_id>/exempt-idle": (f"/jobs/{job}/exempt-idle", {"reason": "walk"}),
        "/jobs/<job_id>/preempt": (f"/jobs/{job}/preempt", {}),
        "/jobs/<int:job_id>/checkpoints": (f"/jobs/{job}/checkpoints", {}),
        "/jobs/<job_id>/cancel": (f"/jobs/{job}/cancel", {}),
        "/previews": ("/previews", {**DEMO, "team": team}),
        "/previews/<preview_id>/confirm": (
            f"/previews/{world['preview_id']}/confirm",
            {"digest": world["digest"], "retry_key": "walk"},
        ),
        "/sources": ("/sources", None),
        "/teams": ("/teams", {"name": "walked-team"}),
        "/teams/<name>/members": (f"/teams/{team}/members", {"username": "carl", "role": "admin"}),
        "/teams/<name>/quotas": (f"/teams/{team}/quotas", {"fleet": "local", "guaranteed_gpus": 0}),
        "/teams/<name>/webhooks": (f"/teams/{team}/webhooks", {"url": "http://127.0.0.1:9/walk"}),
        "/teams/<name>/webhooks/<int:webhook_id>/remove": (
            f"/teams/{team}/webhooks/{world['webhook_id']}/remove",
            {},
        ),
        "/tokens": ("/tokens", {"name": "walked", "teams": [team]}),
        "/tokens/<int:token_id>/revoke": (f"/tokens/{world['spare_token_id']}/revoke", {}),
        **world.get("extra_writes", {}),
    }


def _bearer(
    db: Database, user: int, read_only: bool = False, teams: list[str] | None = None
) -> tuple[dict, int]:
    plaintext, digest = new_token("tpu")
    row = db.call("issue_scoped_api_token", user, "walk", digest, None, teams or [], read_only)[0]
    return {"Authorization": f"Bearer {plaintext}", **JSON}, row["id"]


@pytest.fixture
def app(db_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Flask:
    monkeypatch.setenv("TUNEPLANE_WEBHOOK_ALLOW", "127.0.0.1")  # the webhook form's plain-http target
    return create_app(
        db_url,
        config={"SECRET_KEY": "t", "TP_DATA_DIR": str(tmp_path / "data"), "TP_BLOB_DIR": str(tmp_path / "b")},
    )


@pytest.fixture
def world(app: Flask, db: Database) -> dict:
    """root (installation admin) and tina (a team admin), both admins of teams vision and other; a queued
    job and a preview of vision, a webhook of vision; carl, a user to add."""
    one_local_fleet(db)
    root = add_user(db, "root", "admin")
    tina = add_user(db, "tina")
    add_user(db, "carl")
    vision = db.call("create_team", tina, "vision")[0]["id"]
    other = db.call("create_team", tina, "other")[0]["id"]
    for team in (vision, other):
        db.call("set_team_member", tina, team, root, "admin")
    full, _ = _bearer(db, root)
    client = app.test_client()
    preview = client.post("/previews", json={**DEMO, "team": "vision"}, headers=full).get_json()
    job = client.post(
        f"/previews/{preview['id']}/confirm",
        json={"digest": preview["digest"], "retry_key": "j"},
        headers=full,
    ).get_json()
    second = client.post("/previews", json={**DEMO, "team": "vision"}, headers=full).get_json()
    hook = db.call("create_team_webhook", tina, "vision", "https://hooks.example/x", "s" * 20, None)[0]
    return {
        "root": root,
        "tina": tina,
        "full": full,
        "job_id": job["job_id"],
        "preview_id": second["id"],
        "digest": second["digest"],
        "webhook_id": hook["id"],
        "spare_token_id": _bearer(db, root)[1],
    }


def _send(client: FlaskClient, path: str, body: dict | None, headers: dict):
    if body is None:  # the source upload: a real archive
        return client.post(path, data=_archive(), headers={**headers, "Content-Type": "application/gzip"})
    return client.post(path, json=body, headers=headers)


def _write_rules(app: Flask) -> list[str]:
    return sorted(
        {r.rule for r in app.url_map.iter_rules() if r.methods - {"GET", "HEAD", "OPTIONS"}} - set(NOT_WALKED)
    )


def walk(app: Flask, db: Database, world: dict) -> list[str]:
    """Every write route with every token that may not write there; returns the writes that succeeded."""
    writes = _writes(world)
    rules = _write_rules(app)
    assert [r for r in rules if r not in writes] == [], "a write route with no body here: add it to WRITES"
    client = app.test_client()
    tokens = {}
    for who in ("root", "tina"):
        tokens[f"{who}'s read-only token"] = (_bearer(db, world[who], read_only=True)[0], set())
        tokens[f"{who}'s token scoped to team other"] = (
            _bearer(db, world[who], teams=["other"])[0],
            NOT_SCOPED,
        )
    wrote = []
    for label, (headers, skip) in tokens.items():
        for rule in rules:
            if rule in skip:
                continue
            path, body = writes[rule]
            answer = _send(client, path, body, headers)
            if answer.status_code < 400:
                wrote.append(f"{label}: POST {path} -> {answer.status_code}")
    return wrote


def test_no_token_that_may_not_write_writes_through_any_route(app: Flask, db: Database, world: dict) -> None:
    wrote = walk(app, db, world)
    assert wrote == [], "writes that succeeded:\n" + "\n".join(wrote)
    # The job was neither cancelled nor preempted, the team gained no member.
    assert db.fetch_one("SELECT state FROM jobs WHERE id = %s", (world["job_id"],))["state"] != "cancelled"
    assert db.fetch_one("SELECT count(*) AS n FROM teams WHERE name = 'walked-team'")["n"] == 0
    # The full token of the installation admin is answered on each (so the refusals were the tokens').
    client, writes = app.test_client(), _writes(world)
    unanswered = []
    for rule in sorted(_write_rules(app), key=lambda r: r.endswith(("/cancel", "/fence", "/scheduling"))):
        path, body = writes[rule]
        answer = _send(client, path, body, world["full"])
        expected = CONTROL.get(rule, (None, ""))[0]
        if not (answer.status_code < 400 or answer.status_code == expected):
            unanswered.append(f"POST {path} -> {answer.status_code} {answer.get_data(as_text=True)[:200]}")
    assert unanswered == [], "the full token was refused (so the walk proves nothing there):\n" + "\n".join(
        unanswered
    )
