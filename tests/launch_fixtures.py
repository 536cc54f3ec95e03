"""Test setup for placement and launch: users, fleets, nodes with GPUs and jobs inserted with plain SQL.

This is test setup only; the behaviour under test is always a stored-function call.
"""

from __future__ import annotations

import hashlib
import json
import uuid

from psycopg.rows import dict_row

from tuneplane.app.db import Database


def make_user(db: Database, name: str = "alice", role: str = "user") -> int:
    return db.call("create_user", name, None, role)[0]["id"]


def make_fleet(db: Database, name: str = "gpu") -> int:
    row = db.fetch_one("INSERT INTO fleets (name, backend) VALUES (%s, 'node') RETURNING id", (name,))
    return row["id"]


def make_node(
    db: Database,
    fleet_id: int,
    name: str,
    gpus: int = 4,
    cpus: int = 32,
    memory: int = 256 * 2**30,
    address: str = "127.0.0.1",
) -> int:
    with db.transaction() as conn:
        node_id = conn.execute(
            """INSERT INTO nodes (fleet_id, name, cpus, memory_bytes, address, last_heartbeat_at)
               VALUES (%s, %s, %s, %s, %s, now()) RETURNING id""",
            (fleet_id, name, cpus, memory, address),
        ).fetchone()["id"]
        if gpus:
            conn.execute(
                """INSERT INTO node_gpus (node_id, gpu_index, model, memory_bytes, simulated)
                   SELECT %s, i, 'Simulated GPU', 80 * 2^30, true FROM generate_series(0, %s - 1) i""",
                (node_id, gpus),
            )
    return node_id


def make_job(
    db: Database,
    owner_id: int,
    fleet_id: int,
    nodes: int = 1,
    gpus_per_node: int = 1,
    cpus_per_node: int = 1,
    memory_per_node: int = 0,
    priority: int = 0,
    max_attempts: int = 1,
    team_id: int | None = None,
    preemptible: bool = False,
) -> int:
    """A queued job; team_id None: the owner's default team (the jobs_default_team trigger)."""
    resolved = {"nonce": str(uuid.uuid4()), "nodes": nodes, "gpus_per_node": gpus_per_node}
    canonical = json.dumps(resolved, sort_keys=True, separators=(",", ":"))
    with db.transaction() as conn:
        preview = conn.execute(
            """INSERT INTO previews (owner_id, fleet_id, spec, resolved, canonical, digest, expires_at)
               VALUES (%s, %s, '{}', %s, %s, %s, now() + interval '1 hour') RETURNING id""",
            (
                owner_id,
                fleet_id,
                json.dumps(resolved),
                canonical,
                hashlib.sha256(canonical.encode()).hexdigest(),
            ),
        ).fetchone()["id"]
        return conn.execute(
            """INSERT INTO jobs (owner_id, preview_id, fleet_id, state_reason, priority, nodes, gpus_per_node,
                                 cpus_per_node, memory_per_node, max_attempts, spec, team_id, preemptible)
               VALUES (%s, %s, %s, 'queued', %s, %s, %s, %s, %s, %s, %s, %s, %s) RETURNING id""",
            (
                owner_id,
                preview,
                fleet_id,
                priority,
                nodes,
                gpus_per_node,
                cpus_per_node,
                memory_per_node,
                max_attempts,
                json.dumps(resolved),
                team_id,
                preemptible,
            ),
        ).fetchone()["id"]


def members_of(db: Database, job_id: int) -> list[dict]:
    return db.fetch_all(
        """SELECT m.*, a.number AS attempt FROM members m JOIN attempts a ON a.id = m.attempt_id
            WHERE m.job_id = %s ORDER BY a.number, m.rank""",
        (job_id,),
    )


def job(db: Database, job_id: int) -> dict:
    return db.fetch_one("SELECT * FROM jobs WHERE id = %s", (job_id,))


def report(db: Database, kind: str, member: dict, epochs: dict[int, int] | None = None, **payload) -> dict:
    """A node's report about one of its members, on its agent's session in `epochs` (node id -> epoch;
    epoch 0 otherwise: nodes made here never opened a session)."""
    body = {"member_id": member["id"], **payload}
    return db.call(kind, member["node_id"], (epochs or {}).get(member["node_id"], 0), json.dumps(body))[0]


def run_to_running(db: Database, job_id: int, epochs: dict[int, int] | None = None) -> list[dict]:
    """Drive a reserved job through claim, prepare and commit to running, as worker and agents would
    (their reports on the sessions in `epochs`, as `report`)."""
    attempt = db.fetch_one(
        "SELECT id FROM attempts WHERE job_id = %s ORDER BY number DESC LIMIT 1", (job_id,)
    )
    claim = db.call("claim_launch", attempt["id"], "test-worker")[0]
    db.call("begin_prepare", attempt["id"], claim["epoch"], "0" * 64)
    members = [m for m in members_of(db, job_id) if m["attempt_id"] == attempt["id"]]
    for m in members:
        report(db, "member_prepared", m, epochs)
    for m in members:
        report(db, "member_started", m, epochs, pid=1000 + m["rank"])
    return members


def assert_no_gpu_allocated_twice(db: Database) -> None:
    dupes = db.fetch_all(
        """SELECT node_id, gpu_index, count(*) FROM gpu_allocations WHERE released_at IS NULL
            GROUP BY 1, 2 HAVING count(*) > 1"""
    )
    assert dupes == []
    drift = db.fetch_all(
        """SELECT u.node_id FROM node_usage u
            WHERE u.used_gpus <> (SELECT count(*) FROM gpu_allocations a
                                   WHERE a.node_id = u.node_id AND a.released_at IS NULL)
               OR u.used_cpus <> (SELECT coalesce(sum(cpus), 0) FROM members m
                                   WHERE m.node_id = u.node_id AND m.released_at IS NULL)
               OR u.used_gpus > u.total_gpus"""
    )
    assert drift == []
    assert_team_held_counted(db)


# The held-GPU count (team_fleet_held, its changes) per fleet whose count exists, every non-zero team, against
# the recount from the members; and what readers get (team_fleet_held_now) for every fleet.
_COUNTED = """SELECT x.fleet_id, x.team_id, sum(x.gpus)::int AS gpus, sum(x.members)::int AS members
  FROM (SELECT fleet_id, team_id, gpus, members FROM tuneplane.team_fleet_held
        UNION ALL SELECT fleet_id, team_id, gpus, members FROM tuneplane.team_fleet_held_changes) x
 WHERE x.fleet_id IN (SELECT fleet_id FROM tuneplane.team_fleet_held_built) AND x.fleet_id = ANY (%s)
 GROUP BY x.fleet_id, x.team_id HAVING sum(x.gpus) <> 0 OR sum(x.members) <> 0"""


def assert_team_held_counted(db: Database, fleets: list[int] | None = None) -> None:
    """The GPUs and members each team holds per fleet (every fleet, or those named), as counted, equal the
    sum over its live members: read in one snapshot (REPEATABLE READ), so that it holds while other
    transactions place and release."""
    with db.pool.connection() as conn, conn.transaction():
        conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        cur = conn.cursor(row_factory=dict_row)
        if fleets is None:
            fleets = [f["id"] for f in cur.execute("SELECT id FROM tuneplane.fleets").fetchall()]
        built = {r["fleet_id"] for r in cur.execute("SELECT fleet_id FROM tuneplane.team_fleet_held_built")}
        counted = {
            (r["fleet_id"], r["team_id"]): (r["gpus"], r["members"]) for r in cur.execute(_COUNTED, (fleets,))
        }
        recounted, now = {}, {}
        for f in fleets:
            for r in cur.execute("SELECT * FROM tuneplane.team_fleet_held_recount(%s)", (f,)).fetchall():
                recounted[(f, r["team_id"])] = (r["gpus"], r["members"])
            for r in cur.execute("SELECT * FROM tuneplane.team_fleet_held_now(%s)", (f,)).fetchall():
                now[(f, r["team_id"])] = (r["gpus"], r["members"])
    assert counted == {k: v for k, v in recounted.items() if k[0] in built}, (counted, recounted)
    assert now == recounted, (now, recounted)


def agent_returns(db: Database, node_id: int, running: list[int] | None = None) -> int:
    """A node's agent connects again, as the real one does: opens a session, reconciles (what it still
    runs), then takes every command delivered to it and acknowledges each as done. Returns the epoch."""
    epoch = db.call("node_session_opened", node_id, "127.0.0.1", "test")[0]["epoch"]
    body = {"running": [{"member_id": m, "pid": 1} for m in running or []], "exited": []}
    db.call("reconcile_node", node_id, epoch, json.dumps(body))
    for command in db.call("claim_node_commands", node_id, epoch, 1000):
        db.call("ack_node_command", node_id, epoch, command["id"], json.dumps({"done": True}), None)
    return epoch


def make_team(db: Database, admin_id: int, name: str) -> int:
    return db.call("create_team", admin_id, name)[0]["id"]


def set_quota(
    db: Database,
    admin_id: int,
    team_id: int,
    fleet_id: int,
    guaranteed: int = 0,
    limit: int | None = None,
    weight: float = 1.0,
    overcommit: bool = False,
    gpu_model: str = "",
) -> dict:
    return db.call(
        "set_team_quota", admin_id, team_id, fleet_id, gpu_model, guaranteed, limit, weight, overcommit
    )[0]
