"""The launch lock order under real concurrency (issue 10, item 4): real threads, each with its own
connection to a real PostgreSQL, released together by a barrier so their stored-function calls collide.

* 200 attempts whose 4 members fail PREPARE at the same moment (4 threads, one per rank): every attempt
  gets exactly one ABORT, and nothing deadlocks.
* 200 cancels racing the exits of the same attempt's 4 members (5 threads): every job ends, a cancel is
  either applied or refused because the job already ended (409), and nothing deadlocks.

Afterwards nothing is held: every member released, no GPU allocated, no node usage left. Attempts are
set up a round at a time (25 per placement pass) on connections reused for the whole test.
"""

from __future__ import annotations

import json
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import psycopg
import pytest

from tests.launch_fixtures import make_fleet, make_job, make_node, make_user
from tuneplane.app.db import Database, connect

ATTEMPTS = 200
PER_ROUND = 25  # GPUs per node: one placement pass reserves a whole round
RANKS = 4
DEADLOCK = "40P01"


@dataclass
class Outcomes:
    """What the racing calls answered: SQLSTATE (or "ok") → count, and every unexpected error's text."""

    counts: Counter = field(default_factory=Counter)
    unexpected: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def record(self, state: str, message: str = "", expected: bool = True) -> None:
        with self.lock:
            self.counts[state] += 1
            if not expected:
                self.unexpected.append(f"{state}: {message}")


def _race(db_url: str, actions: list[list[Callable[[psycopg.Connection], None]]], outcomes: Outcomes) -> None:
    """actions[t][i]: what thread t does at the i-th release of the barrier (one connection per thread)."""
    barrier = threading.Barrier(len(actions), timeout=60)

    def run(mine: list[Callable[[psycopg.Connection], None]]) -> None:
        with connect(db_url, autocommit=True, application_name="tuneplane-race") as conn:
            for action in mine:
                barrier.wait()
                try:
                    action(conn)
                except psycopg.Error as exc:
                    outcomes.record(exc.sqlstate or "?", str(exc), expected=False)

    threads = [threading.Thread(target=run, args=(mine,), daemon=True) for mine in actions]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
        assert not thread.is_alive(), "a racing thread hung"


@pytest.fixture
def fleet(db: Database) -> Iterator[dict]:
    fleet_id = make_fleet(db)
    nodes = [make_node(db, fleet_id, f"n{i}", gpus=PER_ROUND) for i in range(RANKS)]
    yield {"id": fleet_id, "nodes": nodes, "user": make_user(db)}


def _rounds(db: Database, fleet: dict) -> Iterator[list[dict]]:
    """Queue ATTEMPTS jobs of RANKS members and place them a round at a time, each round driven to
    `preparing` (claim and begin_prepare, as the worker does). Yields each round's members, by attempt."""
    for _ in range(ATTEMPTS):
        make_job(db, fleet["user"], fleet["id"], nodes=RANKS, gpus_per_node=1)
    placed = 0
    while placed < ATTEMPTS:
        attempts = [r["attempt_id"] for r in db.call("reserve_next", fleet["id"])]
        assert attempts, "the previous round released its GPUs, so the next round must be placed"
        db.fetch_all(
            """SELECT tuneplane.begin_prepare(a, (SELECT epoch FROM tuneplane.claim_launch(a, 'race')),
                                              repeat('0', 64))
                 FROM unnest(%s::bigint[]) a ORDER BY a""",
            (attempts,),
        )
        members = db.fetch_all(
            "SELECT id, node_id, attempt_id, job_id, rank FROM members"
            " WHERE attempt_id = ANY(%s) ORDER BY id",
            (attempts,),
        )
        by_attempt: dict[int, list[dict]] = {}
        for m in members:
            by_attempt.setdefault(m["attempt_id"], []).append(m)
        placed += len(attempts)
        yield [sorted(ms, key=lambda m: m["rank"]) for ms in by_attempt.values()]


def _report(kind: str, member: dict, **payload: object) -> Callable[[psycopg.Connection], None]:
    body = json.dumps({"member_id": member["id"], **payload})

    def call(conn: psycopg.Connection) -> None:
        conn.execute(f"SELECT tuneplane.{kind}(%s, 0, %s)", (member["node_id"], body))

    return call


def _nothing_held(db: Database, fleet: dict) -> None:
    held = db.fetch_one(
        """SELECT (SELECT count(*) FROM members WHERE released_at IS NULL) AS members,
                  (SELECT count(*) FROM gpu_allocations WHERE released_at IS NULL) AS gpus,
                  (SELECT coalesce(sum(used_gpus + used_cpus), 0) FROM node_usage) AS usage"""
    )
    assert held == {"members": 0, "gpus": 0, "usage": 0}


def test_200_attempts_whose_4_members_fail_prepare_at_once_are_each_aborted_once_without_deadlock(
    db: Database, db_url: str, fleet: dict
) -> None:
    # Each attempt its own job, each ended by its abort: no free re-launch (0140) placing jobs again.
    db.fetch_all("UPDATE launch_settings SET free_relaunches = 0 RETURNING 1")
    outcomes = Outcomes()
    for attempts in _rounds(db, fleet):
        # Thread r fails rank r of every attempt of the round; the barrier releases the 4 ranks of one
        # attempt together.
        actions = [
            [_report("member_prepare_failed", ms[rank], reason=f"rank {rank} disk full") for ms in attempts]
            for rank in range(RANKS)
        ]
        _race(db_url, actions, outcomes)
    assert outcomes.unexpected == [], Counter(s.split(":")[0] for s in outcomes.unexpected)
    assert outcomes.counts[DEADLOCK] == 0

    decided = db.fetch_one(
        """SELECT count(*) AS attempts,
                  count(*) FILTER (WHERE a.state = 'aborted' AND d.decision = 'abort') AS aborted,
                  count(*) FILTER (WHERE j.state = 'failed') AS jobs_failed,
                  count(*) FILTER (WHERE d.reason LIKE '%%failed to prepare: rank % disk full') AS with_reason
             FROM attempts a JOIN jobs j ON j.id = a.job_id
             LEFT JOIN launch_decisions d ON d.attempt_id = a.id"""
    )
    assert decided == {
        "attempts": ATTEMPTS,
        "aborted": ATTEMPTS,
        "jobs_failed": ATTEMPTS,
        "with_reason": ATTEMPTS,
    }
    assert db.fetch_one("SELECT count(*) AS n FROM members WHERE state <> 'aborted'")["n"] == 0
    assert db.fetch_one("SELECT count(*) AS n FROM node_commands WHERE kind = 'start'")["n"] == 0
    _nothing_held(db, fleet)


def _running(db: Database, attempts: list[list[dict]]) -> None:
    """Every member of the round reports prepared (COMMIT) and started, as the agents would."""
    ids = [m["id"] for ms in attempts for m in ms]
    for kind in ("member_prepared", "member_started"):
        db.fetch_all(
            f"""SELECT tuneplane.{kind}(m.node_id, 0, jsonb_build_object('member_id', m.id, 'pid', 100))
                  FROM members m WHERE m.id = ANY(%s) ORDER BY m.id""",
            (ids,),
        )


def test_200_cancels_racing_their_members_exits_end_every_job_without_deadlock(
    db: Database, db_url: str, fleet: dict
) -> None:
    outcomes = Outcomes()
    index = 0
    for attempts in _rounds(db, fleet):
        _running(db, attempts)
        cancels: list[Callable[[psycopg.Connection], None]] = []
        exits: list[list[Callable[[psycopg.Connection], None]]] = [[] for _ in range(RANKS)]
        for ms in attempts:
            # Some attempts exit cleanly, in some rank 1 fails (which stops the others), in some every
            # member is killed by a signal.
            codes = [(0, 0, 0, 0), (0, 1, 0, 0), (-15, -15, -15, -15)][index % 3]
            index += 1
            for rank in range(RANKS):
                exits[rank].append(_report("member_exited", ms[rank], exit_code=codes[rank], reason=""))
            cancels.append(_cancel(ms[0]["job_id"], fleet["user"], outcomes))
        _race(db_url, [cancels, *exits], outcomes)
    assert outcomes.unexpected == [], Counter(s.split(":")[0] for s in outcomes.unexpected)
    assert outcomes.counts[DEADLOCK] == 0
    assert outcomes.counts["cancelled"] + outcomes.counts["already ended"] == ATTEMPTS

    ended = db.fetch_all(
        """SELECT j.state AS job, a.state AS attempt, d.decision, count(*) AS n
             FROM attempts a JOIN jobs j ON j.id = a.job_id
             LEFT JOIN launch_decisions d ON d.attempt_id = a.id
            GROUP BY 1, 2, 3 ORDER BY 1, 2, 3"""
    )
    print(f"cancel vs exits: {dict(outcomes.counts)}; outcomes {[(r['job'], r['n']) for r in ended]}")
    assert sum(r["n"] for r in ended) == ATTEMPTS
    for row in ended:
        assert row["decision"] == "commit"
        assert row["job"] in ("succeeded", "failed", "cancelled"), ended
        assert row["attempt"] == row["job"], ended
    assert (
        db.fetch_one(
            "SELECT count(*) AS n FROM members WHERE state NOT IN ('exited', 'failed', 'cancelled')"
        )["n"]
        == 0
    )
    # A cancel that was applied waited for the members' exits: its job is cancelled unless every member
    # had already ended (then the job kept the outcome the exits gave it).
    _nothing_held(db, fleet)


def _cancel(job_id: int, user_id: int, outcomes: Outcomes) -> Callable[[psycopg.Connection], None]:
    def call(conn: psycopg.Connection) -> None:
        try:
            conn.execute("SELECT state FROM tuneplane.cancel_job(%s, %s, 'race')", (job_id, user_id))
        except psycopg.Error as exc:
            if exc.sqlstate == "TP409" and "already" in str(exc):
                outcomes.record("already ended")
                return
            raise
        outcomes.record("cancelled")

    return call
