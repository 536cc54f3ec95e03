"""Fence races (issue 24, point 1): 200 fences, each racing on real threads (one connection each, released
together by a barrier) against everything else that touches the fenced node's jobs at that moment:

* the node's reconcile (its agent reconnected and lists what it runs),
* a user's cancel of a job running there,
* a member exit reported from another node (rank 1 of a two-node job fails: rank 0, on the fenced node,
  gets STOP),
* a member exit reported from the fenced node itself,
* the acknowledgement of a KILL (a deadline passed) and of a STOP that failed (→ KILL).

Every call is made raw (no retry): a deadlock would reach the caller as 40P01 and is counted. The lock
order (sql/functions/launch.sql: jobs by id → attempts → members → node row → leaf rows) leaves none, and
every fence is applied. The fenced node is connected, so its lost members stay held (no retry of their
jobs) until it acknowledges their KILL; after the agent acknowledges every KILL, nothing is held there
and each job is queued for its next attempt or has ended.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from collections.abc import Callable

import psycopg

from tests.db.test_launch_concurrency import DEADLOCK, Outcomes, _race
from tests.launch_fixtures import make_fleet, make_job, make_node, make_user, members_of, run_to_running
from tuneplane.app.db import Database

FENCES = int(os.environ.get("TP_FENCES", "200"))
PER_ROUND = 25


def _scene(db: Database, user: int, k: int) -> dict:
    """One fence's scene: fleet f<k> with node F (5 GPUs) and O (1 GPU). Job A (two members, one on F,
    one on O) and jobs B, C, D, E (one member each, on F) all run; D was cancelled (STOP queued on F), C's
    member got KILL (a deadline passed). Every job may be tried twice."""
    fleet = make_fleet(db, f"f{k}")
    far = make_node(db, fleet, f"F{k}", gpus=5)
    other = make_node(db, fleet, f"O{k}", gpus=1)
    jobs = {"A": make_job(db, user, fleet, nodes=2, priority=10, max_attempts=2)}
    for name in "BCDE":
        jobs[name] = make_job(db, user, fleet, max_attempts=2)
    db.call("reserve_next", fleet, 1000)
    members = {name: run_to_running(db, job_id) for name, job_id in jobs.items()}
    on = {name: next(m for m in ms if m["node_id"] == far) for name, ms in members.items()}
    a_other = next(m for m in members["A"] if m["node_id"] == other)
    db.call("cancel_job", jobs["D"], user, "scene")
    db.fetch_all("SELECT tuneplane.send_kill(%s, ARRAY[%s]::bigint[], 'deadline') AS k", (far, on["C"]["id"]))
    commands = {
        row["kind"]: row["id"]
        for row in db.fetch_all(
            "SELECT kind, id FROM node_commands WHERE node_id = %s AND kind IN ('stop', 'kill')", (far,)
        )
    }
    return {
        "F": far,
        "jobs": jobs,
        "on": on,
        "a_other": a_other,
        "stop": commands["stop"],
        "kill": commands["kill"],
    }


def _call(sql: str, *args: object) -> Callable[[psycopg.Connection], None]:
    def call(conn: psycopg.Connection) -> None:
        conn.execute(sql, args)

    return call


def _expect(
    outcomes: Outcomes, name: str, action: Callable[[psycopg.Connection], None], allowed: tuple[str, ...] = ()
) -> Callable[[psycopg.Connection], None]:
    """The action, its outcome counted under `name`; a refusal whose SQLSTATE is allowed is an answer."""

    def call(conn: psycopg.Connection) -> None:
        try:
            action(conn)
        except psycopg.Error as exc:
            if exc.sqlstate in allowed:
                outcomes.record(f"{name} {exc.sqlstate}")
                return
            raise
        outcomes.record(f"{name} ok")

    return call


def _actions(scene: dict, user: int, outcomes: Outcomes) -> list[Callable[[psycopg.Connection], None]]:
    on = scene["on"]
    running = [{"member_id": m["id"], "pid": 1} for m in on.values()]
    reconcile = json.dumps({"running": running, "exited": []})
    return [
        _expect(
            outcomes,
            "fence",
            _call("SELECT * FROM tuneplane.fence_node(%s, 'race', 'race')", str(scene["F"])),
        ),
        _expect(
            outcomes, "reconcile", _call("SELECT tuneplane.reconcile_node(%s, 0, %s)", scene["F"], reconcile)
        ),
        _expect(
            outcomes,
            "cancel",
            _call("SELECT * FROM tuneplane.cancel_job(%s, %s, 'race')", scene["jobs"]["B"], user),
            ("TP409",),
        ),
        _expect(
            outcomes,
            "exit elsewhere",
            _call(
                "SELECT tuneplane.member_exited(%s, 0, %s)",
                scene["a_other"]["node_id"],
                json.dumps({"member_id": scene["a_other"]["id"], "exit_code": 1, "reason": "race"}),
            ),
        ),
        _expect(
            outcomes,
            "exit here",
            _call(
                "SELECT tuneplane.member_exited(%s, 0, %s)",
                scene["F"],
                json.dumps({"member_id": on["E"]["id"], "exit_code": 0, "reason": ""}),
            ),
        ),
        _expect(
            outcomes,
            "kill ack",
            _call(
                "SELECT * FROM tuneplane.ack_node_command(%s, 0, %s, '{}', NULL)", scene["F"], scene["kill"]
            ),
        ),
        _expect(
            outcomes,
            "stop failed",
            _call(
                "SELECT * FROM tuneplane.ack_node_command(%s, 0, %s, NULL, 'permission denied')",
                scene["F"],
                scene["stop"],
            ),
        ),
    ]


def test_200_fences_racing_reconcile_cancel_exits_and_acks_never_deadlock_and_all_apply(
    db: Database, db_url: str
) -> None:
    user = make_user(db)
    outcomes = Outcomes()
    scenes: list[dict] = []
    for start in range(0, FENCES, PER_ROUND):
        round_scenes = [_scene(db, user, k) for k in range(start, start + PER_ROUND)]
        per_scene = [_actions(scene, user, outcomes) for scene in round_scenes]
        # thread t runs action t of every scene of the round; one barrier release per scene
        _race(db_url, [list(column) for column in zip(*per_scene, strict=True)], outcomes)
        scenes += round_scenes
    print(f"fence races: {dict(sorted(outcomes.counts.items()))}")
    assert outcomes.counts[DEADLOCK] == 0, Counter(s.split(":")[0] for s in outcomes.unexpected)
    assert outcomes.unexpected == [], outcomes.unexpected[:5]
    assert outcomes.counts["fence ok"] == FENCES

    fences = [scene["F"] for scene in scenes]
    fenced = db.fetch_one(
        "SELECT count(*) AS n FROM nodes WHERE id = ANY(%s) AND fenced_at IS NOT NULL", (fences,)
    )
    assert fenced["n"] == FENCES
    # Connected fenced nodes: no job of theirs runs a second attempt while a member of its first is still
    # held there (waiting for the KILL's acknowledgement).
    early = db.fetch_all(
        """SELECT m.job_id FROM members m JOIN attempts a ON a.id = m.attempt_id
            WHERE m.node_id = ANY(%s) AND m.released_at IS NULL
              AND EXISTS (SELECT 1 FROM attempts b WHERE b.job_id = m.job_id AND b.number > a.number)""",
        (fences,),
    )
    assert early == []
    lost_held = db.fetch_one(
        "SELECT count(*) AS n FROM members"
        " WHERE node_id = ANY(%s) AND state = 'lost' AND released_at IS NULL",
        (fences,),
    )["n"]
    assert lost_held > 0

    # The agents acknowledge every KILL (nothing of the lost members runs any more): all is released.
    for node in fences:
        for command in db.fetch_all(
            "SELECT id FROM node_commands WHERE node_id = %s AND kind = 'kill' AND acked_at IS NULL", (node,)
        ):
            db.call("ack_node_command", node, 0, command["id"], json.dumps({"killed": True}), None)
    held = db.fetch_one(
        "SELECT count(*) AS n FROM members WHERE node_id = ANY(%s) AND released_at IS NULL", (fences,)
    )
    assert held["n"] == 0
    for scene in scenes[:5]:
        for job_id in scene["jobs"].values():
            states = {m["state"] for m in members_of(db, job_id)}
            assert not states & {"running", "starting", "stopping"}, (job_id, states)
    live = db.fetch_all(
        """SELECT job_id FROM attempts WHERE state IN ('reserved', 'preparing', 'running', 'stopping')
            GROUP BY job_id HAVING count(*) > 1"""
    )
    assert live == []
