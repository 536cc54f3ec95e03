"""The access rules of sql/functions/access.sql, asked directly: require_job_access, job_access_allowed,
require_admin. Which routes use them is tests/db/test_route_access.py's question."""

from __future__ import annotations

import psycopg
import pytest

from tests.launch_fixtures import make_fleet, make_job, make_user
from tuneplane.app.db import Database
from tuneplane.app.errors import Refusal


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
        "SELECT job_access_allowed(u, j, 'delete') AS ok FROM users u, jobs j WHERE u.id = %s AND j.id = %s",
        (world["root"], world["job"]),
    )
    assert allowed["ok"] is False


def test_the_list_filter_is_inlined_not_called_per_row(db: Database, world: dict) -> None:
    plan = db.fetch_one(
        "EXPLAIN (VERBOSE, FORMAT JSON) SELECT j.id FROM jobs j, users u"
        " WHERE u.id = %s AND tuneplane.job_access_allowed(u, j, 'read')",
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
