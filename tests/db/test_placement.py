from __future__ import annotations

import json
import random
import threading

import psycopg
import pytest

from tests.launch_fixtures import (
    assert_no_gpu_allocated_twice,
    job,
    make_fleet,
    make_job,
    make_node,
    make_user,
    members_of,
    report,
    run_to_running,
)
from tuneplane.app.db import Database
from tuneplane.app.errors import Refusal


@pytest.fixture
def fleet(db: Database) -> dict:
    user = make_user(db)
    fleet_id = make_fleet(db)
    nodes = [make_node(db, fleet_id, f"n{i}", gpus=4) for i in range(2)]
    return {"user": user, "fleet": fleet_id, "nodes": nodes}


def _reserve(db: Database, fleet_id: int) -> list[dict]:
    return db.call("reserve_next", fleet_id, 1000)


def _finish(db: Database, job_id: int) -> None:
    for m in members_of(db, job_id):
        if m["state"] == "running":
            report(db, "member_exited", m, exit_code=0)


def test_gang_jobs_of_8_4_4_never_overlap(db: Database, fleet: dict) -> None:
    big = make_job(db, fleet["user"], fleet["fleet"], nodes=2, gpus_per_node=4)
    a = make_job(db, fleet["user"], fleet["fleet"], nodes=1, gpus_per_node=4)
    b = make_job(db, fleet["user"], fleet["fleet"], nodes=1, gpus_per_node=4)
    placed = _reserve(db, fleet["fleet"])
    assert [p["job_id"] for p in placed] == [big]
    big_members = members_of(db, big)
    assert sorted(m["node_id"] for m in big_members) == sorted(fleet["nodes"])
    assert all(m["gpu_indices"] == [0, 1, 2, 3] for m in big_members)
    assert job(db, a)["state"] == "queued"
    assert "needs 1 node × 4 GPUs" in job(db, a)["state_reason"]
    assert_no_gpu_allocated_twice(db)

    run_to_running(db, big)
    _finish(db, big)
    assert job(db, big)["state"] == "succeeded"
    placed = _reserve(db, fleet["fleet"])
    assert sorted(p["job_id"] for p in placed) == sorted([a, b])
    assert {members_of(db, a)[0]["node_id"], members_of(db, b)[0]["node_id"]} == set(fleet["nodes"])
    assert_no_gpu_allocated_twice(db)


def test_the_table_refuses_a_second_active_allocation_of_a_gpu_without_any_lock(
    db: Database, fleet: dict
) -> None:
    first = make_job(db, fleet["user"], fleet["fleet"])
    second = make_job(db, fleet["user"], fleet["fleet"])
    _reserve(db, fleet["fleet"])
    m1 = members_of(db, first)[0]
    m2 = members_of(db, second)[0]
    with pytest.raises(psycopg.errors.UniqueViolation), db.transaction() as conn:
        conn.execute(
            "INSERT INTO gpu_allocations (member_id, node_id, gpu_index) VALUES (%s, %s, %s)",
            (m2["id"], m1["node_id"], m1["gpu_indices"][0]),
        )


def test_unschedulable_and_disconnected_nodes_get_no_work(db: Database, fleet: dict) -> None:
    n0, n1 = fleet["nodes"]
    db.call("cordon_node", str(n0), "maintenance", "test")
    db.fetch_all(
        "UPDATE nodes SET last_heartbeat_at = now() - interval '1 hour' WHERE id = %s RETURNING id", (n1,)
    )
    j = make_job(db, fleet["user"], fleet["fleet"])
    assert _reserve(db, fleet["fleet"]) == []
    assert "no schedulable connected node" in job(db, j)["state_reason"]
    db.call("uncordon_node", str(n0), "done", "test")
    assert [p["job_id"] for p in _reserve(db, fleet["fleet"])] == [j]
    assert members_of(db, j)[0]["node_id"] == n0


def test_priority_then_age_orders_the_queue(db: Database, fleet: dict) -> None:
    low = make_job(db, fleet["user"], fleet["fleet"], nodes=2, gpus_per_node=4, priority=0)
    high = make_job(db, fleet["user"], fleet["fleet"], nodes=2, gpus_per_node=4, priority=5)
    assert [p["job_id"] for p in _reserve(db, fleet["fleet"])] == [high]
    assert "behind" not in job(db, low)["state_reason"]
    queue = db.fetch_all("SELECT job_id, position FROM v_queue")
    assert queue == [{"job_id": low, "position": 1}]


def test_backfill_never_takes_capacity_the_head_waits_for(db: Database, fleet: dict) -> None:
    n0, n1 = fleet["nodes"]
    blocker = make_job(db, fleet["user"], fleet["fleet"], gpus_per_node=2)  # lands on one node
    _reserve(db, fleet["fleet"])
    blocked_node = members_of(db, blocker)[0]["node_id"]
    free_node = n1 if blocked_node == n0 else n0
    head = make_job(db, fleet["user"], fleet["fleet"], nodes=2, gpus_per_node=4)
    small_ok = make_job(db, fleet["user"], fleet["fleet"], gpus_per_node=2)
    small_too_big = make_job(db, fleet["user"], fleet["fleet"], gpus_per_node=1)
    placed = [p["job_id"] for p in _reserve(db, fleet["fleet"])]
    # The head claims both nodes; the busy node still has 2 free GPUs but the head needs all 4 of each
    # node, so neither small job may run anywhere.
    assert placed == []
    assert f"behind job {head}" in job(db, small_ok)["state_reason"]
    assert job(db, small_too_big)["state"] == "queued"
    del free_node

    # A node the head can never use (too small) is free for backfill.
    tiny = make_node(db, fleet["fleet"], "tiny", gpus=2)
    placed = [p["job_id"] for p in _reserve(db, fleet["fleet"])]
    assert placed == [small_ok]
    assert members_of(db, small_ok)[0]["node_id"] == tiny


def test_concurrent_placement_stress_never_double_allocates(db: Database) -> None:
    rng = random.Random(7)
    user = make_user(db)
    fleet_id = make_fleet(db)
    for i in range(2):
        make_node(db, fleet_id, f"s{i}", gpus=4, cpus=64)
    jobs = [
        make_job(
            db,
            user,
            fleet_id,
            nodes=rng.choice([1, 1, 1, 2]),
            gpus_per_node=rng.choice([1, 2, 4]),
            priority=rng.randint(0, 3),
        )
        for _ in range(200)
    ]
    errors: list[BaseException] = []
    stop = threading.Event()

    def placer() -> None:
        try:
            while not stop.is_set():
                _reserve(db, fleet_id)
        except BaseException as exc:  # surfaced by the assertion below
            errors.append(exc)
            stop.set()

    def finisher() -> None:
        try:
            while not stop.is_set():
                row = db.fetch_one(
                    "SELECT id FROM jobs WHERE state = 'reserved' AND fleet_id = %s"
                    " ORDER BY random() LIMIT 1",
                    (fleet_id,),
                )
                if row is None:
                    if not db.fetch_one(
                        "SELECT 1 AS x FROM jobs WHERE state NOT IN ('succeeded') AND fleet_id = %s LIMIT 1",
                        (fleet_id,),
                    ):
                        stop.set()
                    continue
                try:
                    run_to_running(db, row["id"])
                    _finish(db, row["id"])
                except Refusal:
                    continue  # another finisher got there first
                assert_no_gpu_allocated_twice(db)
        except BaseException as exc:
            errors.append(exc)
            stop.set()

    threads = [threading.Thread(target=placer) for _ in range(3)] + [threading.Thread(target=finisher)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(240)
    stop.set()
    assert not errors, errors
    assert_no_gpu_allocated_twice(db)
    states = db.fetch_all("SELECT state, count(*) AS n FROM jobs WHERE id = ANY(%s) GROUP BY state", (jobs,))
    assert states == [{"state": "succeeded", "n": 200}]
    # Over the whole history, no two allocations of one GPU ever overlapped in time.
    overlaps = db.fetch_one(
        """SELECT count(*) AS n FROM gpu_allocations a JOIN gpu_allocations b
             ON a.node_id = b.node_id AND a.gpu_index = b.gpu_index AND a.member_id < b.member_id
            WHERE tstzrange(a.allocated_at, a.released_at) && tstzrange(b.allocated_at, b.released_at)"""
    )
    assert overlaps["n"] == 0
    assert json.dumps(states)
