"""Fleet and node rules at the SQL level: enrollment, credentials, scheduling, connectivity, the outbox."""

from __future__ import annotations

import datetime as dt
import threading

import psycopg
import pytest
from psycopg.types.json import Jsonb

from tests.helpers import wait_for
from tests.node_helpers import enroll, events, fast_thresholds, make_fleet, make_token
from tuneplane.app.db import Database, connect
from tuneplane.app.errors import Refusal
from tuneplane.app.security import new_token, token_hash


def _open(db: Database, node_id: int, reconcile: bool = True) -> int:
    """A session as the agent opens it: commands flow only once it has reconciled."""
    epoch = db.call("node_session_opened", node_id, "127.0.0.1", "test")[0]["epoch"]
    if reconcile:
        db.call("reconcile_node", node_id, epoch, Jsonb({"running": [], "exited": []}))
    return epoch


def test_enrollment_token_is_one_time_and_stored_hashed(db: Database) -> None:
    make_fleet(db)
    token = make_token(db)
    node, _ = enroll(db, token, "n1")
    assert node["fleet"] == "gpu" and node["node"] == "n1"
    assert (
        db.fetch_one("SELECT count(*) AS n FROM enrollment_tokens WHERE token_hash = %s", (token,))["n"] == 0
    )
    with pytest.raises(Refusal) as reused:
        enroll(db, token, "n2")
    assert reused.value.status == 401 and "already used" in reused.value.message
    assert reused.value.field == "enroll_token"


def test_expired_enrollment_token_is_refused(db: Database) -> None:
    make_fleet(db)
    token = make_token(db, ttl=dt.timedelta(milliseconds=1))
    wait_for(lambda: db.fetch_one("SELECT bool_and(expires_at < now()) AS e FROM enrollment_tokens")["e"])
    with pytest.raises(Refusal) as expired:
        enroll(db, token, "n1")
    assert expired.value.status == 401 and "expired" in expired.value.message


def test_two_enrollments_racing_with_one_token_make_one_node(db: Database) -> None:
    make_fleet(db)
    token = make_token(db)
    outcomes: list[str] = []
    barrier = threading.Barrier(2)

    def attempt(name: str) -> None:
        barrier.wait()
        try:
            enroll(db, token, name)
            outcomes.append("ok")
        except Refusal as exc:
            outcomes.append(exc.message)

    threads = [threading.Thread(target=attempt, args=(f"racer{i}",)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(o == "ok" for o in outcomes) == [False, True]
    assert db.fetch_one("SELECT count(*) AS n FROM nodes")["n"] == 1


def test_enrollment_token_only_for_node_fleets_and_bounded_ttl(db: Database) -> None:
    db.call("create_fleet", "hpc", "slurm", None, None)
    _, digest = new_token("tpe")
    with pytest.raises(Refusal) as wrong_backend:
        db.call("create_enrollment_token", "hpc", digest, dt.timedelta(hours=1), "t")
    assert wrong_backend.value.status == 409
    make_fleet(db)
    with pytest.raises(Refusal) as too_long:
        db.call("create_enrollment_token", "gpu", digest, dt.timedelta(days=365), "t")
    assert too_long.value.field == "ttl"
    with pytest.raises(Refusal) as unknown:
        db.call("create_enrollment_token", "nope", digest, dt.timedelta(hours=1), "t")
    assert unknown.value.status == 404


def test_wrong_credential_is_refused_and_refusal_is_recorded_on_the_node(db: Database) -> None:
    make_fleet(db)
    node, credential = enroll(db, make_token(db), "n1")
    assert db.call("authenticate_node_credential", token_hash(credential))[0]["node_id"] == node["node_id"]
    with pytest.raises(Refusal) as wrong:
        db.call("authenticate_node_credential", token_hash("tpn_wrong"))
    assert wrong.value.status == 401 and wrong.value.message == "unknown node credential"
    db.call(
        "record_node_refusal",
        "authenticate",
        token_hash("tpn_wrong"),
        wrong.value.message,
        "10.0.0.9",
        Jsonb({}),
    )
    refused = events(db, "refused")
    assert refused[-1]["node_id"] is None and "unknown node credential" in refused[-1]["reason"]


def test_rotated_credential_works_during_grace_then_is_refused(db: Database) -> None:
    fast_thresholds(db, grace=1.0)
    make_fleet(db)
    node, old = enroll(db, make_token(db), "n1")
    ident = db.call("authenticate_node_credential", token_hash(old))[0]
    new, new_digest = new_token("tpn")
    new_id = db.call("rotate_node_credential", node["node_id"], ident["credential_id"], new_digest)[0][
        "rotate_node_credential"
    ]
    # Not yet confirmed: the old one has no grace deadline and keeps working.
    assert (
        db.call("authenticate_node_credential", token_hash(old))[0]["credential_id"] == ident["credential_id"]
    )
    db.call("confirm_node_credential", node["node_id"], new_id)
    assert db.call("authenticate_node_credential", token_hash(old))  # inside the grace period
    assert db.call("authenticate_node_credential", token_hash(new))[0]["credential_id"] == new_id
    assert [e["kind"] for e in events(db, "credential_rotated")] == ["credential_rotated"]

    def old_refused() -> str | None:
        try:
            db.call("authenticate_node_credential", token_hash(old))
        except Refusal as exc:
            return exc.message
        return None

    message = wait_for(old_refused, timeout=10)
    assert "rotated out" in message and "grace period ended" in message


def test_a_rotated_out_credential_in_its_grace_period_cannot_start_a_rotation(db: Database) -> None:
    make_fleet(db)
    node, old = enroll(db, make_token(db), "n1")
    first = db.call("authenticate_node_credential", token_hash(old))[0]["credential_id"]
    new, new_digest = new_token("tpn")
    rotated = db.call("rotate_node_credential", node["node_id"], first, new_digest)[0]
    second = rotated["rotate_node_credential"]
    db.call("confirm_node_credential", node["node_id"], second)
    assert db.call("authenticate_node_credential", token_hash(old))  # still inside its grace period
    with pytest.raises(Refusal) as refused:
        db.call("rotate_node_credential", node["node_id"], first, new_token("tpn")[1])
    assert refused.value.status == 409
    assert "only the newest confirmed credential may rotate" in refused.value.message
    creds = db.fetch_all(
        "SELECT id, grace_until IS NULL AS current FROM node_credentials WHERE node_id = %s ORDER BY id",
        (node["node_id"],),
    )
    assert creds == [{"id": first, "current": False}, {"id": second, "current": True}]
    assert db.call("authenticate_node_credential", token_hash(new))[0]["credential_id"] == second
    # The newest confirmed one rotates as before; a never-confirmed one does not.
    third = db.call("rotate_node_credential", node["node_id"], second, new_token("tpn")[1])[0]
    unconfirmed = third["rotate_node_credential"]
    with pytest.raises(Refusal, match="never confirmed"):
        db.call("rotate_node_credential", node["node_id"], unconfirmed, new_token("tpn")[1])


def test_an_interrupted_rotation_is_replaced_not_accumulated(db: Database) -> None:
    make_fleet(db)
    node, old = enroll(db, make_token(db), "n1")
    ident = db.call("authenticate_node_credential", token_hash(old))[0]
    lost_in_transit, lost_digest = new_token("tpn")
    db.call("rotate_node_credential", node["node_id"], ident["credential_id"], lost_digest)
    _, second_digest = new_token("tpn")
    db.call("rotate_node_credential", node["node_id"], ident["credential_id"], second_digest)
    with pytest.raises(Refusal) as revoked:
        db.call("authenticate_node_credential", token_hash(lost_in_transit))
    assert "revoked" in revoked.value.message
    assert db.call("authenticate_node_credential", token_hash(old))


def test_scheduling_changes_write_events_with_who_and_why(db: Database) -> None:
    make_fleet(db)
    enroll(db, make_token(db), "n1")
    row = db.call("cordon_node", "gpu/n1", "bad fan", "user:alice")[0]
    assert row["scheduling_state"] == "cordoned" and row["changed"]
    again = db.call("cordon_node", "n1", "again", "user:alice")[0]
    assert not again["changed"]
    db.call("drain_node", "n1", None, None)
    db.call("uncordon_node", "n1", "fixed", "user:bob")
    log = [
        (e["kind"], e["actor"], e["reason"])
        for e in events(db)
        if e["kind"] in ("cordon", "drain", "uncordon")
    ]
    assert log[0] == ("cordon", "user:alice", "bad fan")
    assert log[1][0] == "drain" and log[1][1].startswith("db:") and log[1][2] == "(no reason given)"
    assert log[2] == ("uncordon", "user:bob", "fixed")
    assert len(log) == 3  # the repeated cordon changed nothing and wrote nothing


def test_retired_node_cannot_come_back_or_connect(db: Database) -> None:
    make_fleet(db)
    node, credential = enroll(db, make_token(db), "n1")
    db.call("retire_node", str(node["node_id"]), "decommissioned", "user:alice")
    with pytest.raises(Refusal) as back:
        db.call("uncordon_node", "n1", None, None)
    assert back.value.status == 409
    with pytest.raises(Refusal) as connect_refused:
        db.call("authenticate_node_credential", token_hash(credential))
    assert connect_refused.value.status == 401 and "revoked" in connect_refused.value.message


def test_unknown_and_ambiguous_node_references_are_refused(db: Database) -> None:
    make_fleet(db, "a")
    make_fleet(db, "b")
    enroll(db, make_token(db, "a"), "same")
    enroll(db, make_token(db, "b"), "same")
    with pytest.raises(Refusal) as ambiguous:
        db.call("cordon_node", "same", None, None)
    assert ambiguous.value.status == 409 and "a/same" not in ambiguous.value.message
    with pytest.raises(Refusal) as unknown:
        db.call("cordon_node", "ghost", None, None)
    assert unknown.value.status == 404
    assert db.call("cordon_node", "b/same", None, None)[0]["fleet"] == "b"


def test_connectivity_follows_heartbeat_age_and_leaves_scheduling_alone(db: Database) -> None:
    fast_thresholds(db, heartbeat=0.2, stale=1.0, lost=2.0)
    make_fleet(db)
    node, _ = enroll(db, make_token(db), "n1")
    db.call("cordon_node", "n1", "maintenance", "user:alice")
    epoch = _open(db, node["node_id"])
    assert (
        db.call("node_heartbeats", Jsonb([{"node_id": node["node_id"], "epoch": epoch}]))[0][
            "node_heartbeats"
        ]
        == 1
    )

    def state() -> tuple[str, str]:
        row = db.fetch_one("SELECT connectivity, scheduling_state FROM v_nodes WHERE node = 'n1'")
        return row["connectivity"], row["scheduling_state"]

    assert state() == ("connected", "cordoned")
    db.call("note_connectivity_changes")
    wait_for(lambda: state() == ("stale", "cordoned"), timeout=5)
    db.call("note_connectivity_changes")
    wait_for(lambda: state() == ("lost", "cordoned"), timeout=5)
    db.call("note_connectivity_changes")
    db.call("note_connectivity_changes")  # nothing changed since: no more events
    changes = [(e["reason"], e["actor"]) for e in events(db, "connectivity")]
    assert changes == [
        ("lost -> connected", "heartbeat-age"),
        ("connected -> stale", "heartbeat-age"),
        ("stale -> lost", "heartbeat-age"),
    ]


def test_heartbeats_of_a_replaced_session_change_nothing(db: Database) -> None:
    make_fleet(db)
    node, _ = enroll(db, make_token(db), "n1")
    old_epoch = _open(db, node["node_id"])
    _open(db, node["node_id"])
    before = db.fetch_one("SELECT last_heartbeat_at FROM nodes")["last_heartbeat_at"]
    touched = db.call("node_heartbeats", Jsonb([{"node_id": node["node_id"], "epoch": old_epoch}]))[0]
    assert touched["node_heartbeats"] == 0
    assert db.fetch_one("SELECT last_heartbeat_at FROM nodes")["last_heartbeat_at"] == before
    with pytest.raises(Refusal) as stale:
        db.call("claim_node_commands", node["node_id"], old_epoch, 10)
    assert stale.value.status == 409 and stale.value.field == "epoch"


def test_heartbeats_never_notify_but_commands_do(db_url: str, db: Database) -> None:
    make_fleet(db)
    node, _ = enroll(db, make_token(db), "n1")
    epoch = _open(db, node["node_id"])
    with connect(db_url, autocommit=True) as listener:
        listener.execute("LISTEN tuneplane_node_commands")
        for _ in range(20):
            db.call("node_heartbeats", Jsonb([{"node_id": node["node_id"], "epoch": epoch, "running": []}]))
        db.call(
            "report_node_capacity",
            node["node_id"],
            epoch,
            Jsonb({"cpus": 4, "memory_bytes": 1, "gpus": [], "container_runtimes": []}),
        )
        assert list(listener.notifies(timeout=0.5, stop_after=1)) == []
        db.call("enqueue_node_command", node["node_id"], "ping", Jsonb({}), "test")
        got = list(listener.notifies(timeout=5, stop_after=1))
        assert [n.payload for n in got] == [str(node["node_id"])]
    sources = db.fetch_all(
        "SELECT proname, prosrc FROM pg_proc WHERE proname IN ('node_heartbeats', 'report_node_capacity')"
    )
    assert len(sources) == 2 and all("notify" not in s["prosrc"].lower() for s in sources)


def test_capacity_report_replaces_gpus_and_marks_simulated(db: Database) -> None:
    make_fleet(db)
    node, _ = enroll(db, make_token(db), "n1")
    epoch = _open(db, node["node_id"])
    gpus = [
        {"index": i, "model": "Simulated GPU", "memory_bytes": 80 << 30, "simulated": True} for i in range(2)
    ]
    capacity = {
        "cpus": 8,
        "memory_bytes": 64 << 30,
        "gpus": gpus,
        "agent_version": "0.1.0",
        "container_runtimes": ["podman"],
        "hostname": "h1",
    }
    assert db.call("report_node_capacity", node["node_id"], epoch, Jsonb(capacity))[0][
        "report_node_capacity"
    ] == {"changed": True}
    again = db.call("report_node_capacity", node["node_id"], epoch, Jsonb(capacity))[0]
    assert again["report_node_capacity"] == {"changed": False}
    view = db.fetch_one("SELECT * FROM v_nodes")
    assert view["gpus"] == 2 and view["simulated_gpus"] == 2 and "(simulated)" in view["gpu_models"]
    assert view["container_runtimes"] == ["podman"] and view["cpus"] == 8
    fleet = db.fetch_one("SELECT * FROM v_fleet")
    assert fleet["gpus"] == 2 and fleet["simulated_gpus"] == 2
    with pytest.raises(Refusal) as malformed:
        db.call("report_node_capacity", node["node_id"], epoch, Jsonb({"cpus": "many"}))
    assert malformed.value.status == 400
    assert len(events(db, "capacity")) == 1


def test_a_capacity_report_missing_or_misshaping_a_field_is_refused_naming_it_and_changes_nothing(
    db: Database,
) -> None:
    """The checks compared jsonb_typeof(...) <> 'number', which is NULL, not true, for a key that is absent:
    `{}` went through to the UPDATE and failed on the NOT NULL column (a 503 "send it again" the agent would
    have repeated for ever; found by tests/e2e/test_fuzz_servers.py)."""
    make_fleet(db)
    node, _ = enroll(db, make_token(db), "n1")
    epoch = _open(db, node["node_id"])
    good = {"cpus": 8, "memory_bytes": 1 << 30, "gpus": [{"index": 0, "model": "H200"}]}
    db.call("report_node_capacity", node["node_id"], epoch, Jsonb(good))
    before = db.fetch_one("SELECT cpus, memory_bytes FROM nodes WHERE id = %s", (node["node_id"],))
    for payload, field in (
        ({}, "cpus"),
        ({"cpus": 8}, "memory_bytes"),
        ({"cpus": -1, "memory_bytes": 1}, "cpus"),
        ({"cpus": 1.5, "memory_bytes": 1}, "cpus"),
        ({"cpus": 1, "memory_bytes": 1e30}, "memory_bytes"),
        ({"cpus": 1, "memory_bytes": 1, "gpus": [{"model": "H200"}]}, "gpus"),
        ({"cpus": 1, "memory_bytes": 1, "gpus": ["H200"]}, "gpus"),
        ({"cpus": 1, "memory_bytes": 1, "gpus": [{"index": -1, "model": "H200"}]}, "gpus"),
        (
            {"cpus": 1, "memory_bytes": 1, "gpus": [{"index": 0, "model": "H200", "memory_bytes": "x"}]},
            "gpus",
        ),
        ({"cpus": 1, "memory_bytes": 1, "gpus": [{"index": 0, "model": "H200", "simulated": 1}]}, "gpus"),
        (
            {"cpus": 1, "memory_bytes": 1, "gpus": [{"index": 0, "model": "a"}, {"index": 0, "model": "b"}]},
            "gpus",
        ),
        ({"cpus": 1, "memory_bytes": 1, "container_runtimes": [1]}, "container_runtimes"),
        ([], "capacity"),
    ):
        with pytest.raises(Refusal) as refused:
            db.call("report_node_capacity", node["node_id"], epoch, Jsonb(payload))
        assert (refused.value.status, refused.value.field) == (400, field), (payload, refused.value.message)
    assert db.fetch_one("SELECT cpus, memory_bytes FROM nodes WHERE id = %s", (node["node_id"],)) == before
    assert [g["model"] for g in db.fetch_all("SELECT model FROM node_gpus")] == ["H200"]


def test_outbox_delivers_in_order_once_per_session_and_again_after_reconnect(db: Database) -> None:
    make_fleet(db)
    node, _ = enroll(db, make_token(db), "n1")
    node_id = node["node_id"]
    epoch = _open(db, node_id)
    ids = [
        db.call("enqueue_node_command", node_id, "ping", Jsonb({"i": i}), "test")[0]["id"] for i in range(3)
    ]
    first = db.call("claim_node_commands", node_id, epoch, 2)
    assert [r["id"] for r in first] == ids[:2]
    assert [r["id"] for r in db.call("claim_node_commands", node_id, epoch, 10)] == ids[2:]
    assert db.call("claim_node_commands", node_id, epoch, 10) == []
    db.call("ack_node_command", node_id, epoch, ids[0], Jsonb({"ok": 1}), None)
    db.call("ack_node_command", node_id, epoch, ids[0], Jsonb({"ok": 2}), None)  # a duplicate keeps the first
    assert db.fetch_one("SELECT result FROM node_commands WHERE id = %s", (ids[0],))["result"] == {"ok": 1}
    new_epoch = _open(db, node_id)
    assert [r["id"] for r in db.call("claim_node_commands", node_id, new_epoch, 10)] == ids[1:]
    with pytest.raises(Refusal):
        db.call("ack_node_command", node_id, new_epoch, ids[1] + 999, None, None)
    with pytest.raises(Refusal) as replaced:  # an ack from a replaced session is refused
        db.call("ack_node_command", node_id, epoch, ids[1], None, None)
    assert replaced.value.status == 409


def test_commands_are_withheld_from_a_session_until_it_reconciled(db: Database) -> None:
    make_fleet(db)
    node, _ = enroll(db, make_token(db), "n1")
    node_id = node["node_id"]
    epoch = _open(db, node_id, reconcile=False)
    db.call("enqueue_node_command", node_id, "ping", Jsonb({}), "test")
    assert db.call("claim_node_commands", node_id, epoch, 10) == []
    assert db.call("nodes_with_pending_commands", [node_id]) == []
    db.call("reconcile_node", node_id, epoch, Jsonb({"running": [], "exited": []}))
    assert db.call("nodes_with_pending_commands", [node_id]) == [{"node_id": node_id}]
    assert len(db.call("claim_node_commands", node_id, epoch, 10)) == 1


def test_one_claim_takes_several_sessions_commands_and_skips_a_replaced_or_unreconciled_one(
    db: Database,
) -> None:
    make_fleet(db)
    ids = {name: enroll(db, make_token(db), name)[0]["node_id"] for name in ("n1", "n2", "n3", "n4")}
    epochs = {name: _open(db, node_id) for name, node_id in ids.items()}
    stale = epochs["n3"]
    epochs["n3"] = _open(db, ids["n3"])  # n3's first session was replaced: its claim gets nothing
    epochs["n4"] = _open(db, ids["n4"], reconcile=False)  # n4's session has not reconciled yet
    sent = {
        name: [
            db.call("enqueue_node_command", node_id, "ping", Jsonb({"i": i}), "test")[0]["id"]
            for i in range(3)
        ]
        for name, node_id in ids.items()
    }
    names = ["n2", "n1", "n3", "n4"]
    claimed = db.call(
        "claim_sessions_commands",
        [ids[n] for n in names],
        [stale if n == "n3" else epochs[n] for n in names],
        2,
    )
    # Node by node in node id order, each node's oldest first, at most p_limit each.
    assert [r["id"] for r in claimed] == sent["n1"][:2] + sent["n2"][:2]
    assert {r["claimed_epoch"] for r in claimed if r["node_id"] == ids["n1"]} == {epochs["n1"]}
    rest = db.call("claim_sessions_commands", [ids["n1"], ids["n2"], ids["n3"]],
                   [epochs["n1"], epochs["n2"], epochs["n3"]], 10)  # fmt: skip
    assert [r["id"] for r in rest] == sent["n1"][2:] + sent["n2"][2:] + sent["n3"]
    assert db.call("claim_sessions_commands", [ids["n1"]], [epochs["n1"]], 10) == []
    with pytest.raises(Refusal) as mismatch:
        db.call("claim_sessions_commands", [ids["n1"], ids["n2"]], [epochs["n1"]], 10)
    assert mismatch.value.status == 400 and mismatch.value.field == "epochs"
    # n4 reconciles: its commands flow, through the many-session claim as through the one-session one.
    db.call("reconcile_node", ids["n4"], epochs["n4"], Jsonb({"running": [], "exited": []}))
    assert [r["id"] for r in db.call("claim_sessions_commands", [ids["n4"]], [epochs["n4"]], 10)] == sent[
        "n4"
    ]


def test_concurrent_claims_of_one_session_never_hand_out_a_command_twice(db_url: str, db: Database) -> None:
    make_fleet(db)
    node, _ = enroll(db, make_token(db), "n1")
    epoch = _open(db, node["node_id"])
    for i in range(200):
        db.call("enqueue_node_command", node["node_id"], "ping", Jsonb({"i": i}), "test")
    claimed: list[int] = []
    lock = threading.Lock()
    barrier = threading.Barrier(4)

    def claimer() -> None:
        with psycopg.connect(db_url, autocommit=True, options="-c search_path=tuneplane,public") as conn:
            barrier.wait()
            while True:
                rows = conn.execute(
                    "SELECT id FROM claim_node_commands(%s, %s, 7)", (node["node_id"], epoch)
                ).fetchall()
                if not rows:
                    return
                with lock:
                    claimed.extend(r[0] for r in rows)

    threads = [threading.Thread(target=claimer) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(claimed) == sorted(set(claimed)) and len(claimed) == 200
