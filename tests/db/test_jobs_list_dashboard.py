"""Issue 15 point 9: the jobs list filters by state, owner and fleet and pages (keyset); the home page
is a dashboard (JSON the same data). Visibility stays the stored function's: a user's filter cannot
reach another user's jobs."""

from __future__ import annotations

from tests.launch_fixtures import make_job
from tests.submission_setup import add_fleet, add_node, add_user
from tests.telemetry_support import user_api_token
from tuneplane.app.db import Database
from tuneplane.app.web import create_app


def _client(db_url: str, db: Database, user: int):
    client = create_app(db_url, config={"SECRET_KEY": "test"}).test_client()
    client.environ_base.update(
        HTTP_AUTHORIZATION=f"Bearer {user_api_token(db, user)}", HTTP_ACCEPT="application/json"
    )
    return client


def test_jobs_list_filters_by_state_owner_and_fleet_and_pages(db_url: str, db: Database) -> None:
    local, gpu = add_fleet(db, "local"), add_fleet(db, "gpu")
    root = add_user(db, "root", role="admin")
    bob = add_user(db, "bob")
    mine = [make_job(db, root, local) for _ in range(7)]
    bobs = [make_job(db, bob, gpu) for _ in range(3)]
    db.call("cancel_job", bobs[0], bob, "changed my mind")
    admin = _client(db_url, db, root)

    def ids(query: str) -> list[int]:
        answer = admin.get("/jobs" + query)
        assert answer.status_code == 200, answer.get_json()
        return [j["id"] for j in answer.get_json()["jobs"]]

    assert ids("?owner=bob") == bobs[::-1]
    assert ids("?fleet=local") == mine[::-1]
    assert ids("?owner=bob&state=cancelled") == [bobs[0]]
    assert ids("?owner=bob&fleet=local") == []
    assert ids("?owner=nobody") == []
    first = admin.get("/jobs?fleet=local&limit=3").get_json()
    assert [j["id"] for j in first["jobs"]] == mine[::-1][:3] and first["next_before"] == mine[-3]
    second = admin.get(f"/jobs?fleet=local&limit=3&before={first['next_before']}").get_json()
    assert [j["id"] for j in second["jobs"]] == mine[::-1][3:6]
    last = admin.get(f"/jobs?fleet=local&limit=3&before={second['next_before']}").get_json()
    assert [j["id"] for j in last["jobs"]] == [mine[0]] and last["next_before"] is None
    # bob asking for root's jobs sees none of them.
    assert [j["id"] for j in _client(db_url, db, bob).get("/jobs?owner=root").get_json()["jobs"]] == []
    assert admin.get("/jobs?limit=500").status_code == 400  # at most 499 a page


def test_home_is_a_dashboard_of_my_jobs_and_the_fleets(db_url: str, db: Database) -> None:
    local = add_fleet(db, "local")
    add_node(db, local, "local-1", gpus=2)
    alice, bob = add_user(db, "alice"), add_user(db, "bob")
    job = make_job(db, alice, local)
    make_job(db, bob, local)
    data = _client(db_url, db, alice).get("/").get_json()
    assert [j["id"] for j in data["jobs"]] == [job]
    assert data["jobs"][0]["state"] == "queued" and data["jobs"][0]["state_reason"]
    (fleet,) = data["fleets"]
    assert fleet["fleet"] == "local" and fleet["connected"] == 1 and fleet["free_gpus"] == 2
    page = create_app(db_url, config={"SECRET_KEY": "test"}).test_client().get("/")
    assert page.status_code == 200 and b"Log in" in page.data
