"""The usage ledger (sql/functions/usage.sql): one row per member per attempt, opened and closed by the
transactions that reserve and release the member, exact for every way an attempt can end."""

from __future__ import annotations

import json
import random
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest

from tests.launch_fixtures import make_job, make_node, make_user, members_of, report, run_to_running
from tuneplane.app.db import Database
from tuneplane.app.errors import Refusal

TERMINAL = ("succeeded", "failed", "cancelled")


def _attempts(db: Database, fleet: int, state: str) -> list[dict]:
    return db.fetch_all(
        "SELECT id, job_id FROM attempts WHERE fleet_id = %s AND state = %s ORDER BY id", (fleet, state)
    )


def _held(db: Database, attempt_id: int) -> list[dict]:
    return db.fetch_all(
        "SELECT * FROM members WHERE attempt_id = %s AND released_at IS NULL ORDER BY rank", (attempt_id,)
    )


def _report(db: Database, kind: str, member: dict, **payload) -> None:
    """A node's report in its current control session (a fenced node's agent came back in a new one)."""
    node = db.fetch_one("SELECT session_epoch FROM nodes WHERE id = %s", (member["node_id"],))
    epoch = node["session_epoch"]
    db.call(kind, member["node_id"], epoch, json.dumps({"member_id": member["id"], **payload}))


def _run(db: Database, attempt_id: int) -> None:
    """Claim, prepare and commit a reserved attempt and start its members, as worker and agents would."""
    claim = db.call("claim_launch", attempt_id, "test-worker")[0]
    db.call("begin_prepare", attempt_id, claim["epoch"], "0" * 64)
    for kind in ("member_prepared", "member_started"):
        for m in _held(db, attempt_id):
            _report(db, kind, m, pid=1000 + m["rank"])


def _exit_stopping(db: Database, attempt_id: int, code: int = -15) -> None:
    """The agents confirm what STOP asked: every still-held member of the attempt has ended."""
    for m in _held(db, attempt_id):
        if m["state"] in ("starting", "running", "stopping"):
            _report(db, "member_exited", m, exit_code=code)


def _drive(db: Database, fleet: int, nodes: dict[str, int], admin: int, rng: random.Random) -> dict[str, int]:
    """Runs every job of the fleet to an end through the real lifecycle functions, choosing at random how
    each attempt ends: success, a failing rank (retried while attempts remain), a cancel, a failed prepare
    (free re-launch) or a fenced node. Returns how many attempts ended each way."""
    seen = {
        "succeeded": 0,
        "failed_rank": 0,
        "cancel_running": 0,
        "cancel_queued": 0,
        "prepare_failed": 0,
        "fenced": 0,
    }
    fenced: str | None = None
    for _round in range(2000):
        open_jobs = db.fetch_all(
            "SELECT id, state FROM jobs WHERE fleet_id = %s AND state <> ALL (%s) ORDER BY id",
            (fleet, list(TERMINAL)),
        )
        if not open_jobs:
            return seen
        if fenced is not None and rng.random() < 0.3:
            # The fenced node's agent comes back, acknowledges its KILLs, and the operator lets it work.
            from tests.launch_fixtures import agent_returns

            agent_returns(db, nodes[fenced])
            db.call("unfence_node", fenced, "repaired", "test")
            fenced = None
        queued = [j for j in open_jobs if j["state"] == "queued"]
        if queued and rng.random() < 0.05:
            db.call("cancel_job", rng.choice(queued)["id"], admin, "not needed")
            seen["cancel_queued"] += 1
        db.call("reserve_next", fleet, 1000)
        for attempt in _attempts(db, fleet, "reserved"):
            if rng.random() < 0.1:
                claim = db.call("claim_launch", attempt["id"], "test-worker")[0]
                db.call("begin_prepare", attempt["id"], claim["epoch"], "0" * 64)
                m = _held(db, attempt["id"])[0]
                _report(db, "member_prepare_failed", m, reason="disk full")
                seen["prepare_failed"] += 1
            else:
                _run(db, attempt["id"])
        for attempt in _attempts(db, fleet, "running"):
            roll = rng.random()
            held = _held(db, attempt["id"])
            state = db.fetch_one("SELECT state FROM attempts WHERE id = %s", (attempt["id"],))["state"]
            if state != "running":  # a fence earlier in this round stopped it
                _exit_stopping(db, attempt["id"])
                continue
            if roll < 0.5:
                for m in held:
                    _report(db, "member_exited", m, exit_code=0)
                seen["succeeded"] += 1
            elif roll < 0.7:
                _report(db, "member_exited", held[-1], exit_code=1)
                _exit_stopping(db, attempt["id"])
                seen["failed_rank"] += 1
            elif roll < 0.8:
                db.call("cancel_job", attempt["job_id"], admin, "changed my mind")
                _exit_stopping(db, attempt["id"])
                seen["cancel_running"] += 1
            elif roll < 0.9 and fenced is None:
                fenced = db.fetch_one("SELECT name FROM nodes WHERE id = %s", (held[0]["node_id"],))["name"]
                db.call("fence_node", fenced, "dead", "test")
                _exit_stopping(db, attempt["id"])
                seen["fenced"] += 1
            # else: it keeps running into the next round
    raise AssertionError("the jobs did not all end within 2000 rounds")


def test_ledger_gpu_seconds_equal_the_gpus_held_exactly_over_200_jobs(db: Database) -> None:
    rng = random.Random(20)
    fleet = db.fetch_one("INSERT INTO fleets (name, backend) VALUES ('gpu', 'node') RETURNING id")["id"]
    nodes = {f"n{i}": make_node(db, fleet, f"n{i}", gpus=4) for i in range(4)}
    users = [make_user(db, "alice"), make_user(db, "bob")]
    admin = make_user(db, "root", "admin")
    jobs = [
        make_job(db, rng.choice(users), fleet, nodes=rng.choice([1, 1, 1, 2]),
                 gpus_per_node=rng.randint(0, 4), cpus_per_node=rng.randint(1, 4),
                 max_attempts=rng.randint(1, 3))
        for _ in range(200)
    ]  # fmt: skip
    seen = _drive(db, fleet, nodes, admin, rng)
    # Every way of ending happened (the seed was chosen so; a change of the lifecycle may need another).
    assert all(seen.values()), seen

    # The independent record: the placement's own GPU allocations (reserve_next inserts them, release_member
    # ends them); the ledger is written by other functions (open_usage, close_usage).
    reference = db.fetch_one(
        """SELECT sum(extract(epoch FROM released_at - allocated_at)) AS s, count(*) FILTER
                  (WHERE released_at IS NULL) AS held FROM gpu_allocations"""
    )
    ledger = db.fetch_one(
        """SELECT sum(gpu_seconds) AS s, count(*) AS n, count(*) FILTER (WHERE ended_at IS NULL) AS open
             FROM usage_ledger"""
    )
    assert reference["held"] == 0 and ledger["open"] == 0
    assert ledger["n"] == db.fetch_one("SELECT count(*) AS n FROM members")["n"]
    assert ledger["s"] == reference["s"] and ledger["s"] > 0  # Decimal: exact to the microsecond

    # Per member, against members and jobs: GPUs held, how it ended, team and user.
    wrong = db.fetch_all(
        """SELECT l.member_id FROM usage_ledger l JOIN members m ON m.id = l.member_id
             JOIN jobs j ON j.id = m.job_id JOIN attempts a ON a.id = m.attempt_id
             LEFT JOIN LATERAL (SELECT min(allocated_at) AS at, max(allocated_at) AS last
                                  FROM gpu_allocations g WHERE g.member_id = m.id) g ON true
            WHERE l.gpus <> cardinality(m.gpu_indices) OR l.ended_at <> m.released_at
               OR l.ended_how <> m.state OR l.team_id <> j.team_id OR l.user_id <> j.owner_id
               OR l.attempt <> a.number OR l.cpus <> m.cpus OR l.started_at <> g.at OR g.at <> g.last
               OR l.started_at < a.created_at"""
    )
    assert wrong == []
    ended = {r["ended_how"] for r in db.fetch_all("SELECT DISTINCT ended_how FROM usage_ledger")}
    assert {"exited", "failed", "cancelled", "aborted", "lost"} <= ended
    retried = db.fetch_one("SELECT count(DISTINCT job_id) AS n FROM usage_ledger WHERE attempt > 1")["n"]
    assert retried > 0
    assert len(jobs) == 200

    # The report adds up to the same total, by team, by user, by job and split by day.
    since = datetime.now(UTC) - timedelta(days=1)
    for by in ("team", "user", "job", "day"):
        rows = db.call("usage_report", admin, by, None, since, None)
        total = sum(r["gpu_seconds"] for r in rows)
        assert total == ledger["s"], (by, total, ledger["s"])


def test_a_member_still_holding_counts_up_to_now_and_closes_once(db: Database) -> None:
    fleet = db.fetch_one("INSERT INTO fleets (name, backend) VALUES ('gpu', 'node') RETURNING id")["id"]
    make_node(db, fleet, "n0", gpus=4)
    alice = make_user(db, "alice")
    job_id = make_job(db, alice, fleet, gpus_per_node=2)
    db.call("reserve_next", fleet, 10)
    members = run_to_running(db, job_id)
    row = db.fetch_one("SELECT * FROM v_usage WHERE job_id = %s", (job_id,))
    assert row["holding"] and row["ended_at"] is None and row["gpu_seconds"] > 0
    assert row["team"] == "alice" and row["user"] == "alice" and row["gpu_model"] == "Simulated GPU"

    report(db, "member_exited", members[0], exit_code=0)
    closed = db.fetch_one("SELECT * FROM usage_ledger WHERE job_id = %s", (job_id,))
    assert closed["ended_how"] == "exited" and closed["gpu_seconds"] > 0
    # A late duplicate report (at-least-once delivery) changes nothing.
    report(db, "member_exited", members[0], exit_code=0)
    again = db.fetch_one("SELECT * FROM usage_ledger WHERE job_id = %s", (job_id,))
    assert again == closed
    assert members_of(db, job_id)[0]["released_at"] == closed["ended_at"]


def test_a_day_split_adds_up_and_a_window_clips(db: Database) -> None:
    fleet = db.fetch_one("INSERT INTO fleets (name, backend) VALUES ('gpu', 'node') RETURNING id")["id"]
    make_node(db, fleet, "n0", gpus=4)
    alice = make_user(db, "alice")
    admin = make_user(db, "root", "admin")
    team = db.fetch_one("SELECT id FROM teams WHERE name = 'alice'")["id"]
    # Test setup: a historic row spanning two midnights (rows are written by open/close_usage only).
    db.fetch_all(
        """INSERT INTO usage_ledger (member_id, job_id, attempt_id, attempt, rank, team_id, user_id, fleet_id,
                                     node_id, node_name, gpu_model, gpus, cpus, memory_bytes, started_at,
                                     ended_at, ended_how)
           SELECT -1, -1, -1, 1, 0, %s, %s, %s, -1, 'n0', 'A100', 2, 4, 0, '2026-11-01 18:00Z',
                  '2026-11-03 06:00Z', 'exited'
           RETURNING member_id""",
        (team, alice, fleet),
    )
    since, until = datetime(2026, 10, 30, tzinfo=UTC), datetime(2026, 11, 10, tzinfo=UTC)
    days = db.call("usage_report", alice, "day", None, since, until)
    assert [(str(r["day"]), r["gpu_seconds"]) for r in days] == [
        ("2026-11-01", Decimal(2 * 6 * 3600)),
        ("2026-11-02", Decimal(2 * 24 * 3600)),
        ("2026-11-03", Decimal(2 * 6 * 3600)),
    ]
    whole = db.call("usage_report", alice, "team", "alice", since, until)
    assert whole[0]["gpu_seconds"] == Decimal(2 * 36 * 3600) and whole[0]["cost"] is None
    clipped = db.call("usage_report", alice, "team", None, datetime(2026, 11, 2, tzinfo=UTC),
                      datetime(2026, 11, 2, 12, tzinfo=UTC))  # fmt: skip
    assert clipped[0]["gpu_seconds"] == Decimal(2 * 12 * 3600)

    # A price turns it into cost: the model's own price wins over the fleet's.
    db.call("set_usage_price", admin, "gpu", None, Decimal("1.00"), "USD")
    db.call("set_usage_price", admin, "gpu", "A100", Decimal("2.50"), "USD")
    priced = db.call("usage_report", alice, "team", None, since, until)[0]
    assert priced["cost"] == Decimal("180.00") and priced["currency"] == "USD"  # 72 GPU-hours × 2.50


def test_usage_of_another_team_is_not_there(db: Database) -> None:
    fleet = db.fetch_one("INSERT INTO fleets (name, backend) VALUES ('gpu', 'node') RETURNING id")["id"]
    make_node(db, fleet, "n0", gpus=4)
    alice, bob = make_user(db, "alice"), make_user(db, "bob")
    job_id = make_job(db, alice, fleet, gpus_per_node=1)
    db.call("reserve_next", fleet, 10)
    run_to_running(db, job_id)
    since = datetime.now(UTC) - timedelta(hours=1)
    assert db.call("usage_report", bob, "team", None, since, None) == []
    with pytest.raises(Refusal) as refused:
        db.call("usage_report", bob, "team", "alice", since, None)
    assert refused.value.status == 404 and "team" in refused.value.fields
    assert [r["team"] for r in db.call("usage_report", alice, "team", None, since, None)] == ["alice"]


@pytest.mark.parametrize(
    ("by", "since", "field"),
    [("week", datetime(2026, 1, 1, tzinfo=UTC), "by"), ("team", datetime(2999, 1, 1, tzinfo=UTC), "since")],
)
def test_bad_report_questions_are_refused_naming_the_field(db: Database, by: str, since: datetime,
                                                           field: str) -> None:  # fmt: skip
    alice = make_user(db, "alice")
    with pytest.raises(Refusal) as refused:
        db.call("usage_report", alice, by, None, since, None)
    assert refused.value.status == 400 and field in refused.value.fields


def test_only_an_installation_admin_sets_prices(db: Database) -> None:
    db.fetch_one("INSERT INTO fleets (name, backend) VALUES ('gpu', 'node') RETURNING id")
    alice, admin = make_user(db, "alice"), make_user(db, "root", "admin")
    with pytest.raises(Refusal) as refused:
        db.call("set_usage_price", alice, "gpu", None, Decimal(1), "USD")
    assert refused.value.status == 403
    with pytest.raises(Refusal) as refused:
        db.call("set_usage_price", admin, "gpu", None, Decimal(-1), "USD")
    assert refused.value.status == 400 and "price" in refused.value.fields


def test_a_slurm_members_row_opens_when_the_allocation_starts_and_closes_when_it_ends(db: Database) -> None:
    fleet = db.call("create_slurm_fleet", "hpc", "debug", "/etc/slurm/slurm.conf",
                    json.dumps({"shared_path": "/shared"}), None, None)[0]["id"]  # fmt: skip
    status = {"version": "22.05.8", "partition": {"max_nodes": 2, "max_time_minutes": 60},
              "nodes": [{"name": "s1", "address": "127.0.0.1", "state": "idle", "reason": None, "cpus": 8,
                         "memory_mb": 1000, "gpus": 4, "gpu_model": "A100"}]}  # fmt: skip
    db.call("slurm_sync_fleet", fleet, json.dumps(status))
    alice = make_user(db, "alice")
    job_id = make_job(db, alice, fleet, gpus_per_node=2, cpus_per_node=2)
    attempt = db.call("slurm_submissions_due", fleet)[0]["attempt_id"]
    db.call("slurm_submitted", attempt, 4242)
    assert db.fetch_one("SELECT count(*) AS n FROM usage_ledger")["n"] == 0  # pending in Slurm: nothing held
    db.call("slurm_allocation_started", attempt, ["s1"], 29500, "0" * 64)
    row = db.fetch_one("SELECT * FROM usage_ledger WHERE job_id = %s", (job_id,))
    assert (row["gpus"], row["gpu_model"], row["cpus"], row["node_name"], row["ended_at"]) == (
        2, "A100", 2, "s1", None
    )  # fmt: skip
    db.call("slurm_job_ended", attempt, "NODE_FAIL", None)
    member = db.fetch_one("SELECT * FROM members WHERE job_id = %s", (job_id,))
    row = db.fetch_one("SELECT * FROM usage_ledger WHERE job_id = %s", (job_id,))
    assert row["ended_at"] == member["released_at"] and row["ended_how"] == member["state"]
    assert row["gpu_seconds"] > 0
