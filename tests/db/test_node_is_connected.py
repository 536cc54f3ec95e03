"""node_is_connected (sql/functions/nodes.sql): the one rule for a node that may take new work, which
placement, its free-capacity read and its best-fit explanation all ask."""

from __future__ import annotations

from tests.submission_setup import add_fleet, add_node
from tuneplane.app.db import Database


def _connected(db: Database, node_id: int) -> bool:
    row = db.fetch_one(
        "SELECT node_is_connected(n, (SELECT node_fresh_since())) AS ok FROM nodes n WHERE n.id = %s",
        (node_id,),
    )
    return row["ok"]


def test_only_an_active_unfenced_node_heard_within_stale_after_is_connected(db: Database) -> None:
    fleet = add_fleet(db, "gpu")
    node = add_node(db, fleet, "n1", gpus=1)
    assert _connected(db, node)
    for change, undo in (
        ("scheduling_state = 'draining'", "scheduling_state = 'active'"),
        ("fenced_at = now()", "fenced_at = NULL"),
        ("last_heartbeat_at = now() - (SELECT stale_after FROM node_settings) - interval '1 s'",
         "last_heartbeat_at = now()"),
        ("last_heartbeat_at = NULL", "last_heartbeat_at = now()"),
    ):  # fmt: skip
        db.fetch_one(f"UPDATE nodes SET {change} WHERE id = %s RETURNING id", (node,))
        assert _connected(db, node) is False, change
        db.fetch_one(f"UPDATE nodes SET {undo} WHERE id = %s RETURNING id", (node,))
        assert _connected(db, node), undo
    # The free-capacity read follows the same rule.
    assert [r["node_id"] for r in db.call("fleet_free_capacity", fleet)] == [node]
    db.fetch_one("UPDATE nodes SET fenced_at = now() WHERE id = %s RETURNING id", (node,))
    assert db.call("fleet_free_capacity", fleet) == []


def test_it_is_inlined_into_a_locking_query(db: Database) -> None:
    plan = db.fetch_one(
        "EXPLAIN (VERBOSE, FORMAT JSON) SELECT n.id FROM tuneplane.nodes n"
        " WHERE tuneplane.node_is_connected(n, now()) FOR KEY SHARE OF n SKIP LOCKED"
    )
    assert "node_is_connected" not in str(plan)
