"""The node's cache sizes (environments, capsules): reported by its agent, kept on the node row, shown on
the Fleet page (HTML and JSON)."""

from __future__ import annotations

import pytest
from psycopg.types.json import Jsonb

from tests.node_helpers import enroll, make_fleet, make_token
from tuneplane.app.db import Database
from tuneplane.app.errors import Refusal
from tuneplane.app.security import hash_password
from tuneplane.app.web import create_app

SIZES = {"environments": {"count": 2, "bytes": 3 * 1024**3 // 2}, "capsules": {"count": 5, "bytes": 1024**3}}


def test_cache_sizes_are_kept_and_shown_on_the_fleet_page(db_url: str, db: Database) -> None:
    make_fleet(db)
    node, _ = enroll(db, make_token(db), "n1")
    epoch = db.call("node_session_opened", node["node_id"], "127.0.0.1", "t")[0]["epoch"]
    admin = db.call("create_user", "root", hash_password("pw"), "admin")[0]["id"]
    client = create_app(db_url).test_client()
    with client.session_transaction() as session:
        session["user_id"] = admin
    assert "not reported" in client.get("/fleets/gpu").get_data(as_text=True)
    db.call("report_node_caches", node["node_id"], epoch, Jsonb(SIZES))
    html = client.get("/fleets/gpu").get_data(as_text=True)  # the fleet's page lists its nodes
    assert "<th>Caches</th>" in html
    assert "environments: 2 · 1.5 GiB" in html and "capsules: 5 · 1.0 GiB" in html
    listed = client.get("/fleets", headers={"Accept": "application/json"}).get_json()
    assert str(listed).count("'environments': {'bytes': 1610612736, 'count': 2}") == 1
    with pytest.raises(Refusal) as bad:
        db.call("report_node_caches", node["node_id"], epoch, Jsonb({"capsules": SIZES["capsules"]}))
    assert bad.value.status == 400 and bad.value.field == "environments"
    with pytest.raises(Refusal) as stale:
        db.call("report_node_caches", node["node_id"], epoch - 1, Jsonb(SIZES))
    assert stale.value.status == 409
