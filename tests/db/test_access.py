"""The access rules of sql/functions/access.sql, asked directly: require_job_access, job_access_allowed,
require_admin. Which routes use them is tests/db/test_route_access.py's question."""

from __future__ import annotations

import psycopg
import pytest

from tests.launch_fixtures import make_fleet, make_job, make_team, make_user
from tuneplane.app.db import Database
from tuneplane.app.errors import Refusal
from tuneplane.app.security import new_token


@pytest.fixture
def world(db: Database) -> dict:
    fleet = make_fleet(db)
    ids = {name: make_user(db, name, role) for name, role in
           (("alice", "user"), ("bob", "user"), ("root", "admin"), ("gone", "admin"))}  # fmt: skip
    db.fetch_one("UPDATE users SET disabled_at = now() WHERE id = %s RETURNING id", (ids["gone"],))
    ids["job"] = make_job(db, ids["alice"], fleet)
    return ids


def _refusal(db: Database, *args: object) -> Refusal:
    with pytest.raises(Refusal) as caught:
        db.call("require_job_access", *args)
    return caught.value


@pytest.mark.parametrize("action", ["read", "act"])
def test_the_owner_and_an_admin_may_and_no_one_else(db: Database, world: dict, action: str) -> None:
    for who in ("alice", "root"):
        assert db.call("require_job_access", world[who], world["job"], action)[0]["id"] == world["job"]
    error = _refusal(db, world["bob"], world["job"], action)
    assert (error.status, error.field, error.message) == (404, "job_id", f"no job {world['job']} of yours")


def test_a_teams_jobs_are_its_members_viewers_only_read_and_other_teams_see_nothing(
    db: Database, world: dict
) -> None:
    fleet = db.fetch_one("SELECT fleet_id FROM jobs WHERE id = %s", (world["job"],))["fleet_id"]
    carol, dave = make_user(db, "carol"), make_user(db, "dave")
    vision = make_team(db, world["alice"], "vision")
    db.call("set_team_member", world["alice"], vision, world["bob"], "member")
    db.call("set_team_member", world["alice"], vision, carol, "viewer")
    make_team(db, dave, "nlp")
    job = make_job(db, world["alice"], fleet, team_id=vision)
    for who in ("alice", "bob", "root"):
        for action in ("read", "act"):
            assert db.call("require_job_access", world[who], job, action)[0]["id"] == job
    assert db.call("require_job_access", carol, job, "read")[0]["id"] == job
    viewer = _refusal(db, carol, job, "act")
    assert (viewer.status, viewer.field) == (403, "job_id") and "of which you are a viewer" in viewer.message
    assert _refusal(db, dave, job, "read").status == 404
    assert _refusal(db, dave, job, "act").status == 404
    # The owner's personal team holds the older job: a team member of vision sees nothing of it.
    assert _refusal(db, world["bob"], world["job"], "read").status == 404


def _under_token(db: Database, user: int, job: int, action: str, read_only: bool, teams: list[str]) -> object:
    """require_job_access in a transaction acting under a fresh token of the user (as app/db.py sets it)."""
    token = db.call("issue_scoped_api_token", user, "t", new_token("tpu")[1], None, teams, read_only)
    with db.transaction() as conn:
        conn.execute("SELECT set_config('tuneplane.token_id', %s, true)", (str(token[0]["id"]),))
        return conn.execute("SELECT * FROM require_job_access(%s, %s, %s)", (user, job, action)).fetchone()


def test_a_token_narrows_the_role_read_only_and_to_its_teams(db: Database, world: dict) -> None:
    fleet = db.fetch_one("SELECT fleet_id FROM jobs WHERE id = %s", (world["job"],))["fleet_id"]
    vision = make_team(db, world["alice"], "vision")
    job = make_job(db, world["alice"], fleet, team_id=vision)
    assert _under_token(db, world["alice"], job, "read", True, [])["id"] == job
    with pytest.raises(Refusal) as caught:
        _under_token(db, world["alice"], job, "act", True, ["alice"])
    assert caught.value.status == 404  # scoped to her personal team: vision's job is out of reach
    with pytest.raises(Refusal) as caught:
        _under_token(db, world["alice"], job, "act", True, [])
    assert caught.value.status == 403 and "may only read" in caught.value.message


def test_a_disabled_user_may_nothing_even_an_admin(db: Database, world: dict) -> None:
    # job_visible_to (artifacts.sql) let a disabled user see their jobs' artifacts; the one rule does not.
    assert _refusal(db, world["gone"], world["job"], "read").status == 404
    db.fetch_one("UPDATE users SET disabled_at = now() WHERE id = %s RETURNING id", (world["alice"],))
    assert _refusal(db, world["alice"], world["job"], "read").status == 404


def test_a_missing_job_and_an_unknown_user_get_the_same_answer_as_a_foreign_job(
    db: Database, world: dict
) -> None:
    missing = _refusal(db, world["alice"], world["job"] + 1000, "read")
    assert (missing.status, missing.field) == (404, "job_id")
    assert _refusal(db, 987654, world["job"], "read").status == 404


def test_an_unknown_action_is_a_programming_error_not_a_refusal(db: Database, world: dict) -> None:
    with pytest.raises(psycopg.Error) as caught:
        db.call("require_job_access", world["root"], world["job"], "delete")
    assert caught.value.sqlstate == "P0001" and "unknown action" in str(caught.value)
    allowed = db.fetch_one(
        "SELECT job_access_allowed(u, j, 'delete', 'admin', NULL, NULL) AS ok FROM users u, jobs j"
        " WHERE u.id = %s AND j.id = %s",
        (world["root"], world["job"]),
    )
    assert allowed["ok"] is False


def test_the_list_filter_is_inlined_not_called_per_row(db: Database, world: dict) -> None:
    plan = db.fetch_one(
        "EXPLAIN (VERBOSE, FORMAT JSON) SELECT j.id FROM jobs j, users u"
        " WHERE u.id = %s AND tuneplane.job_access_allowed(u, j, 'read', NULL, NULL, NULL)",
        (world["bob"],),
    )
    assert "job_access_allowed" not in str(plan)


def test_require_admin_refuses_users_and_disabled_admins(db: Database, world: dict) -> None:
    assert db.call("require_admin", world["root"], "this")[0]["id"] == world["root"]
    for who in ("bob", "gone"):
        with pytest.raises(Refusal) as caught:
            db.call("require_admin", world[who], "setting limits")
        refusal = caught.value
        assert (refusal.status, refusal.field, refusal.message) == (
            403,
            "actor",
            "setting limits needs the admin role",
        )
