"""Fencing from the console API and the CLI, and the node's last peer-network/shared-storage checks."""

from __future__ import annotations

import json

from tests.launch_fixtures import (
    agent_returns,
    job,
    make_fleet,
    make_job,
    make_node,
    make_user,
    members_of,
    run_to_running,
)
from tuneplane.app.db import Database
from tuneplane.app.security import hash_password, new_token
from tuneplane.app.web import create_app


def _admin_client(db: Database, db_url: str):
    admin = db.call("create_user", "ops", hash_password("pw"), "admin")[0]
    plaintext, digest = new_token("tpu")
    db.call("issue_api_token", admin["id"], "test", digest, None)
    client = create_app(db_url).test_client()
    return client, {"Authorization": f"Bearer {plaintext}", "Accept": "application/json"}


def test_fence_over_http_releases_resources_and_unfence_restores_placement(db: Database, db_url: str) -> None:
    user = make_user(db)
    fleet = make_fleet(db)
    node = make_node(db, fleet, "n0", gpus=2)
    job_id = make_job(db, user, fleet, gpus_per_node=2)
    db.call("reserve_next", fleet, 1000)
    run_to_running(db, job_id)
    client, headers = _admin_client(db, db_url)
    response = client.post("/nodes/fence", json={"node": "gpu/n0", "reason": "psu died"}, headers=headers)
    assert response.status_code == 200, response.get_json()
    assert response.get_json()["members_lost"] == 1
    assert members_of(db, job_id)[0]["state"] == "lost"
    # The node is connected: its member stays held (the job is not over) until the KILL is acknowledged.
    assert members_of(db, job_id)[0]["released_at"] is None
    assert job(db, job_id)["state"] == "running"
    row = client.get("/fleets/gpu", headers=headers).get_json()
    assert json.dumps(row)  # the fleet view still renders
    other = make_job(db, user, fleet, gpus_per_node=2)
    assert db.call("reserve_next", fleet, 1000) == []
    # Unfence is refused until the agent came back, reconciled and acknowledged the KILLs of the fence.
    response = client.post("/nodes/fence", json={"node": str(node), "action": "unfence"}, headers=headers)
    assert response.status_code == 409 and "reconnect" in response.get_json()["error"], response.get_json()
    agent_returns(db, node)
    assert job(db, job_id)["state"] == "failed"
    response = client.post("/nodes/fence", json={"node": str(node), "action": "unfence"}, headers=headers)
    assert response.get_json() == {"node_id": node, "unfenced": True}
    assert [r["job_id"] for r in db.call("reserve_next", fleet, 1000)] == [other]


def test_fence_refusals_name_the_field(db: Database, db_url: str) -> None:
    client, headers = _admin_client(db, db_url)
    assert client.post("/nodes/fence", json={"action": "explode", "node": "x"}, headers=headers).get_json()[
        "fields"
    ] == {"action": "action must be fence or unfence"}
    response = client.post("/nodes/fence", json={"node": "nope"}, headers=headers)
    assert response.status_code == 404 and "node" in response.get_json()["fields"]


def test_fence_needs_an_admin(db: Database, db_url: str) -> None:
    user = db.call("create_user", "bob", hash_password("pw"), "user")[0]
    plaintext, digest = new_token("tpu")
    db.call("issue_api_token", user["id"], "test", digest, None)
    client = create_app(db_url).test_client()
    response = client.post(
        "/nodes/fence",
        json={"node": "x"},
        headers={"Authorization": f"Bearer {plaintext}", "Accept": "application/json"},
    )
    assert response.status_code == 403


def test_fleet_page_shows_fence_and_last_checks(db: Database, db_url: str) -> None:
    fleet = make_fleet(db)
    node = make_node(db, fleet, "n0", gpus=1)
    db.fetch_all(
        """UPDATE nodes SET last_peer_check = '{"ok": false, "error": "cannot reach rank 1 on n1"}',
                            last_storage_check = '{"ok": true, "path": "/shared"}',
                            fenced_at = now(), fenced_reason = 'dead' WHERE id = %s RETURNING id""",
        (node,),
    )
    client, headers = _admin_client(db, db_url)
    nodes = client.get("/fleets/gpu", headers=headers).get_json()
    assert json.dumps(nodes)
    html = client.get("/fleets/gpu", headers={"Authorization": headers["Authorization"]}).get_data(
        as_text=True
    )
    assert "cannot reach rank 1 on n1" in html and "fenced" in html and "Unfence" in html
    assert 'shared storage: <span class="state ok">ok</span>' in html


def test_fenced_nodes_do_not_count_as_schedulable_in_v_fleet_and_on_the_fleet_page(
    db: Database, db_url: str
) -> None:
    fleet = make_fleet(db)
    make_node(db, fleet, "n0", gpus=2)
    make_node(db, fleet, "n1", gpus=4)
    db.call("fence_node", "gpu/n1", "psu died", "test")
    row = db.fetch_one("SELECT schedulable_gpus, gpus, fenced FROM v_fleet WHERE fleet_id = %s", (fleet,))
    assert row == {"schedulable_gpus": 2, "gpus": 6, "fenced": 1}
    client, headers = _admin_client(db, db_url)
    page = client.get("/fleets/gpu", headers={"Authorization": headers["Authorization"]})
    html = page.get_data(as_text=True)
    assert "2 schedulable / 6 reported" in html and "1 fenced" in html
