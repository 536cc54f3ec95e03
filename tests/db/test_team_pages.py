"""The console's team page, the Fleet page's team shares and the quota effect of a preview
(sql/functions/team_reads.sql, app/web/teams.py)."""

from __future__ import annotations

import pytest

from tests.launch_fixtures import make_fleet, make_job, make_node, run_to_running
from tuneplane.app.db import Database
from tuneplane.app.errors import Refusal
from tuneplane.app.security import hash_password, new_token
from tuneplane.app.web import create_app


def _user(db: Database, name: str, role: str = "user") -> tuple[int, dict]:
    user = db.call("create_user", name, hash_password("pw"), role)[0]
    plaintext, digest = new_token("tpu")
    db.call("issue_api_token", user["id"], "test", digest, None)
    return user["id"], {"Authorization": f"Bearer {plaintext}", "Accept": "application/json"}


def _team(db: Database, name: str) -> int:
    return db.fetch_one("SELECT id FROM teams WHERE name = %s", (name,))["id"]


@pytest.fixture
def fleet(db: Database) -> int:
    fleet_id = make_fleet(db)
    make_node(db, fleet_id, "n0", gpus=8)
    return fleet_id


def test_quota_effect_says_within_borrowed_waiting_or_past_the_limit(db: Database, fleet: int) -> None:
    admin, _ = _user(db, "root", "admin")
    alice, _ = _user(db, "alice")
    team = _team(db, "alice")

    def effect(gpus: int, preemptible: bool) -> str:
        return db.call("quota_effect", team, fleet, gpus, preemptible)[0]["quota_effect"]

    assert "has no team quotas" in effect(2, False)
    db.call("set_team_quota", admin, team, fleet, "", 4, 6, 1.0, False)
    assert effect(2, False).endswith("2 of 4 guaranteed with it: within the guarantee")
    job_id = make_job(db, alice, fleet, gpus_per_node=4)
    db.call("reserve_next", fleet, 10)
    run_to_running(db, job_id)
    assert effect(2, True) == (
        "team alice uses 4 of its 4 guaranteed GPUs on fleet gpu (limit 6); this job asks 2: "
        "6 with it: 2 above the guarantee, borrowed from idle GPUs (it is preemptible)"
    )
    assert "it is not preemptible, so it waits" in effect(2, False)
    assert "7 with it, past the limit of 6" in effect(3, True)


def test_team_admin_manages_members_and_others_cannot(db_url: str, db: Database, fleet: int) -> None:
    alice, alice_h = _user(db, "alice")
    _bob, bob_h = _user(db, "bob")
    _carol, carol_h = _user(db, "carol")
    client = create_app(db_url).test_client()
    added = client.post("/teams/alice/members", json={"username": "carol", "role": "viewer"}, headers=alice_h)
    assert added.status_code == 200 and added.get_json()["role"] == "viewer"
    page = client.get("/teams/alice", headers=carol_h).get_json()
    assert [(m["username"], m["role"]) for m in page["members"]] == [("alice", "admin"), ("carol", "viewer")]
    assert page["webhooks"] is None  # only the team's admins see its webhooks
    refused = client.post("/teams/alice/members", json={"username": "bob", "role": "member"}, headers=carol_h)
    assert refused.status_code == 403
    assert client.get("/teams/alice", headers=bob_h).status_code == 404
    assert client.post("/teams/alice/members", json={"username": "bob", "role": "member"},
                       headers=bob_h).status_code == 404  # fmt: skip
    bad = client.post("/teams/alice/members", json={"username": "bob", "role": "owner"}, headers=alice_h)
    assert bad.status_code == 400 and "role" in bad.get_json()["fields"]
    nobody = client.post("/teams/alice/members", json={"username": "zed", "role": "member"}, headers=alice_h)
    assert nobody.status_code == 404 and "username" in nobody.get_json()["fields"]
    assert alice


def test_installation_admin_sets_a_quota_and_the_gauge_shows_use_and_borrowing(
    db_url: str, db: Database, fleet: int
) -> None:
    _admin, admin_h = _user(db, "root", "admin")
    alice, alice_h = _user(db, "alice")
    client = create_app(db_url).test_client()
    quotas = "/teams/alice/quotas"
    denied = client.post(quotas, json={"fleet": "gpu", "guaranteed_gpus": 2}, headers=alice_h)
    assert denied.status_code == 403
    too_many = client.post(quotas, json={"fleet": "gpu", "guaranteed_gpus": 9}, headers=admin_h)
    assert too_many.status_code == 409 and "8 schedulable GPUs" in too_many.get_json()["error"]
    ok = client.post("/teams/alice/quotas", json={"fleet": "gpu", "guaranteed_gpus": 2, "limit_gpus": 6},
                     headers=admin_h)  # fmt: skip
    assert ok.status_code == 200
    within = make_job(db, alice, fleet, gpus_per_node=2)
    db.call("reserve_next", fleet, 10)
    run_to_running(db, within)
    borrower = make_job(db, alice, fleet, gpus_per_node=3)
    db.fetch_all("UPDATE jobs SET preemptible = true WHERE id = %s RETURNING 1", (borrower,))  # test setup
    db.call("reserve_next", fleet, 10)
    waiting = make_job(db, alice, fleet, gpus_per_node=4)
    db.call("reserve_next", fleet, 10)
    page = client.get("/teams/alice", headers=alice_h).get_json()
    gauge = page["quotas"][0]
    assert (gauge["fleet"], gauge["used_gpus"], gauge["borrowed_gpus"], gauge["guaranteed_gpus"],
            gauge["limit_gpus"], gauge["queued_gpus"]) == ("gpu", 5, 3, 2, 6, 4)  # fmt: skip
    queue = [(q["job_id"], q["position_overall"], q["position_in_team"]) for q in page["queue"]]
    assert queue == [(waiting, 1, 1)]
    assert "limit" in page["queue"][0]["reason"]
    fleet_page = client.get("/fleets", headers=alice_h).get_json()["fleets"][0]
    shares = [(s["team"], s["used_gpus"], s["borrowed_gpus"]) for s in fleet_page["team_shares"]]
    assert shares == [("alice", 5, 3)]
    html = client.get("/teams/alice", headers={**alice_h, "Accept": "text/html"}).get_data(as_text=True)
    assert 'class="tp-gauge"' in html and 'id="member-form"' in html and 'id="quota-form"' not in html


def test_team_reads_refuse_a_team_the_actor_is_not_in(db: Database) -> None:
    _user(db, "alice")
    bob, _ = _user(db, "bob")
    for fn in ("team_members_of", "team_quotas_of", "team_queue_of"):
        with pytest.raises(Refusal) as refused:
            db.call(fn, bob, "alice")
        assert refused.value.status == 404, fn


def test_a_user_creates_a_team_and_is_its_admin(db_url: str, db: Database) -> None:
    _alice, headers = _user(db, "alice")
    client = create_app(db_url).test_client()
    made = client.post("/teams", json={"name": "vision"}, headers=headers)
    assert made.status_code == 201 and made.get_json()["name"] == "vision"
    mine = {t["team"]: t["role"] for t in client.get("/teams", headers=headers).get_json()["teams"]}
    assert mine == {"alice": "admin", "vision": "admin"}
    assert client.post("/teams", json={"name": "vision"}, headers=headers).status_code == 409
    bad = client.post("/teams", json={"name": "Vision!"}, headers=headers)
    assert bad.status_code == 400 and "name" in bad.get_json()["fields"]
