"""The Fleet page and the fleet/node HTTP API: HTML and JSON from one endpoint, admin-only changes."""

from __future__ import annotations

from psycopg.types.json import Jsonb

from tests.node_helpers import enroll, events, make_fleet, make_token
from tuneplane.app.db import Database
from tuneplane.app.security import hash_password, new_token
from tuneplane.app.web import create_app


def _user(db: Database, name: str, role: str) -> tuple[int, dict]:
    user = db.call("create_user", name, hash_password("pw"), role)[0]
    plaintext, digest = new_token("tpu")
    db.call("issue_api_token", user["id"], "test", digest, None)
    return user["id"], {"Authorization": f"Bearer {plaintext}", "Accept": "application/json"}


def _connected_node(db: Database) -> dict:
    make_fleet(db)
    node, _ = enroll(db, make_token(db), "n1")
    epoch = db.call("node_session_opened", node["node_id"], "127.0.0.1", "t")[0]["epoch"]
    gpus = [{"index": 0, "model": "Simulated GPU", "memory_bytes": 80 << 30, "simulated": True}]
    db.call(
        "report_node_capacity",
        node["node_id"],
        epoch,
        Jsonb(
            {
                "cpus": 16,
                "memory_bytes": 64 << 30,
                "gpus": gpus,
                "agent_version": "0.1.0",
                "container_runtimes": ["podman"],
            }
        ),
    )
    return node


def test_fleet_page_shows_scheduling_and_connectivity_as_separate_columns(db_url: str, db: Database) -> None:
    _connected_node(db)
    db.call("cordon_node", "n1", "disk check", "user:ops")
    admin_id, _ = _user(db, "root", "admin")
    client = create_app(db_url).test_client()
    with client.session_transaction() as session:
        session["user_id"] = admin_id
    page = client.get("/fleets/gpu")
    html = page.get_data(as_text=True)
    assert page.status_code == 200
    assert "<th>Scheduling</th><th>Connectivity</th>" in html
    assert 'class="state scheduling cordoned"' in html and 'class="state connectivity connected"' in html
    assert "simulated" in html and "64.0 GiB" in html and "podman" in html
    assert 'hx-trigger="every 3s"' in html and ">Uncordon</button>" in html and "disk check" in html
    assert 'href="/fleets"' in html  # the navigation entry
    # The htmx refresh gets only the live part, rendered by the same view.
    partial = client.get("/fleets/gpu", headers={"HX-Request": "true", "HX-Target": "fleet-live"})
    text = partial.get_data(as_text=True)
    assert text.lstrip().startswith('<div id="fleet-live"') and "<html" not in text


def test_users_see_the_fleet_but_have_no_buttons_and_cannot_change_it(db_url: str, db: Database) -> None:
    _connected_node(db)
    user_id, headers = _user(db, "alice", "user")
    client = create_app(db_url).test_client()
    with client.session_transaction() as session:
        session["user_id"] = user_id
    html = client.get("/fleets/gpu").get_data(as_text=True)
    assert "n1" in html and ">Cordon</button>" not in html and "New enrollment token" not in html
    refused = client.post("/nodes/scheduling", json={"node": "n1", "action": "cordon"}, headers=headers)
    assert refused.status_code == 403
    assert client.post("/fleets", json={"name": "x"}, headers=headers).status_code == 403
    anonymous = create_app(db_url).test_client().get("/fleets", headers={"Accept": "application/json"})
    assert anonymous.status_code == 401


def test_admin_api_creates_fleets_tokens_and_changes_scheduling_with_who_and_why(
    db_url: str, db: Database
) -> None:
    _, headers = _user(db, "root", "admin")
    client = create_app(db_url, config={"TP_NODE_GATEWAY_URL": "https://gw.example:8081"}).test_client()
    created = client.post(
        "/fleets",
        json={"name": "train", "backend": "node", "capabilities": {"nvlink": True}},
        headers=headers,
    )
    assert created.status_code == 201 and created.get_json()["capabilities"] == {"nvlink": True}
    duplicate = client.post("/fleets", json={"name": "train"}, headers=headers)
    assert duplicate.status_code == 409 and duplicate.get_json()["fields"] == {
        "name": duplicate.get_json()["error"]
    }
    unknown_backend = client.post("/fleets", json={"name": "k8s", "backend": "nomad"}, headers=headers)
    assert unknown_backend.status_code == 400 and "backend" in unknown_backend.get_json()["fields"]

    token = client.post("/fleets/train/enrollment-tokens", json={"ttl": "10m"}, headers=headers).get_json()
    assert token["token"].startswith("tpe_") and "--server https://gw.example:8081" in token["command"]
    bad_ttl = client.post("/fleets/train/enrollment-tokens", json={"ttl": "soon"}, headers=headers)
    assert bad_ttl.status_code == 400 and bad_ttl.get_json()["fields"].keys() == {"ttl"}
    enroll(db, token["token"], "box1")

    changed = client.post(
        "/nodes/scheduling",
        json={"node": "train/box1", "action": "drain", "reason": "reboot"},
        headers=headers,
    )
    assert changed.status_code == 200 and changed.get_json()["scheduling_state"] == "draining"
    assert (events(db, "drain")[-1]["actor"], events(db, "drain")[-1]["reason"]) == ("user:root", "reboot")
    bad = client.post("/nodes/scheduling", json={"node": "train/box1", "action": "explode"}, headers=headers)
    assert bad.status_code == 400
    missing = client.post("/nodes/scheduling", json={"node": "nope", "action": "cordon"}, headers=headers)
    assert missing.status_code == 404

    listing = client.get("/fleets", headers=headers).get_json()["fleets"]
    train = next(f for f in listing if f["fleet"] == "train")
    assert train["draining"] == 1 and train["node_list"][0]["connectivity"] == "lost"
    shown = client.get("/fleets/train", headers=headers).get_json()
    assert shown["fleet"]["node_list"][0]["node"] == "box1" and shown["events"]
    assert client.get("/fleets/nope", headers=headers).status_code == 404


def test_team_table_counts_cpus_and_the_overview_is_not_a_fleets_page(db_url: str, db: Database) -> None:
    """A CPU-only job holds no GPU but its CPUs show in its team's row; the new-fleet form is on the
    overview (/fleets) only, below the fleets; a fleet's own page says which fleet and links back."""
    from tests.launch_fixtures import make_fleet as make_launch_fleet
    from tests.launch_fixtures import make_job, make_node, run_to_running

    admin_id, headers = _user(db, "root", "admin")
    fleet = make_launch_fleet(db, "cpu")
    make_node(db, fleet, "c0", gpus=0, cpus=16)
    job = make_job(db, admin_id, fleet, gpus_per_node=0, cpus_per_node=6)
    db.call("reserve_next", fleet, 10)
    run_to_running(db, job)
    client = create_app(db_url).test_client()
    shares = client.get("/fleets/cpu", headers=headers).get_json()["fleet"]["team_shares"]
    assert [(s["team"], s["used_gpus"], s["used_cpus"]) for s in shares] == [("root", 0, 6)]

    with client.session_transaction() as session:
        session["user_id"] = admin_id
    overview = client.get("/fleets").get_data(as_text=True)
    assert "<h1>Fleets</h1>" in overview
    assert overview.index('data-fleet="cpu"') < overview.index("New fleet")
    one = client.get("/fleets/cpu").get_data(as_text=True)
    assert "<h1>Fleet cpu</h1>" in one and "New fleet" not in one and 'href="/fleets"' in one
    assert '<td data-cell="cpus">6</td>' in one


def test_the_fleets_overview_has_one_row_per_fleet_and_the_nodes_are_on_each_fleets_page(
    db_url: str, db: Database
) -> None:
    """/fleets sums each fleet up in a row (backend, storage, nodes connected of enrolled, GPUs free of
    reported, jobs running and waiting) linking to /fleets/<name>, which alone has the node table (issue 36:
    both pages carried the whole node table)."""
    import re

    from tests.launch_fixtures import make_fleet as make_launch_fleet
    from tests.launch_fixtures import make_job, make_node, run_to_running

    admin_id, headers = _user(db, "root", "admin")
    gpu = make_launch_fleet(db, "gpu")
    make_launch_fleet(db, "empty")
    make_node(db, gpu, "g0", gpus=4)
    make_node(db, gpu, "g1", gpus=4)
    db.fetch_all("UPDATE nodes SET last_heartbeat_at = NULL WHERE name = 'g1' RETURNING id")  # lost
    running = make_job(db, admin_id, gpu, gpus_per_node=1)
    db.call("reserve_next", gpu, 10)
    run_to_running(db, running)
    make_job(db, admin_id, gpu, gpus_per_node=8)  # fits no node: waits
    client = create_app(db_url).test_client()
    with client.session_transaction() as session:
        session["user_id"] = admin_id
    overview = client.get("/fleets").get_data(as_text=True)
    rows = dict(re.findall(r'<tr data-fleet="([a-z]+)">(.*?)</tr>', overview, re.S))
    assert set(rows) == {"gpu", "empty"}
    cells = dict(re.findall(r'<td data-cell="(\w+)"[^>]*>([^<]*)</td>', rows["gpu"]))
    assert cells == {"nodes": "1 / 2", "gpus": "3 / 8", "running": "1", "waiting": "1"}, cells
    assert 'href="/fleets/gpu"' in rows["gpu"] and ">node</td>" in rows["gpu"] and "filesystem" in rows["gpu"]
    assert dict(re.findall(r'<td data-cell="(\w+)"[^>]*>([^<]*)</td>', rows["empty"]))["nodes"] == "0 / 0"
    assert "<th>Scheduling</th>" not in overview and "data-node=" not in overview
    assert "New enrollment token" not in overview and "New fleet" in overview
    one = client.get("/fleets/gpu").get_data(as_text=True)
    assert 'id="fleets-overview"' not in one and "<th>Scheduling</th>" in one
    assert 'data-node="g0"' in one and 'data-node="g1"' in one and "New enrollment token" in one
    assert 'aria-current="true">Fleets</a>' in one and 'aria-current="page">Fleets</a>' in overview
    listing = client.get("/fleets", headers=headers).get_json()["fleets"]  # the JSON keeps every node
    counts = {
        f["fleet"]: (len(f["node_list"]), f["free_gpus"], f["running_jobs"], f["waiting_jobs"])
        for f in listing
    }
    assert counts == {"gpu": (2, 3, 1, 1), "empty": (0, 0, 0, 0)}


def test_an_enrollment_tokens_event_says_its_expiry_to_the_minute_in_utc(db: Database) -> None:
    import re

    make_fleet(db)
    make_token(db)
    reason = db.fetch_one(
        "SELECT reason FROM node_events WHERE kind = 'enrollment_token_created' ORDER BY id DESC LIMIT 1"
    )["reason"]
    assert re.fullmatch(r"expires \d{4}-\d\d-\d\d \d\d:\d\d UTC", reason), reason
