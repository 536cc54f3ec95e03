"""The idle-GPU policy over the real sweep (sql/functions/idle.sql), fed by simulated GPUs: NVML-shaped
samples written as telemetry through the real telemetry gateway (tests/simulated_gpus.py)."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator

import psycopg
import pytest

from tests.launch_fixtures import (
    make_fleet,
    make_job,
    make_node,
    make_team,
    make_user,
    report,
    run_to_running,
)
from tests.simulated_gpus import BUSY, IDLE, Reading, post_samples
from tests.telemetry_support import GatewayThread, member_token, running_gateway
from tuneplane.app.db import Database
from tuneplane.app.errors import Refusal

MIN = 60.0


@pytest.fixture
def gateway(db_url: str) -> Iterator[GatewayThread]:
    with running_gateway(db_url) as g:
        yield g


@pytest.fixture
def admin(db: Database) -> int:
    return make_user(db, "root", "admin")


def two_member_job(
    db: Database,
    admin: int,
    action: str = "reclaim",
    grace: dt.timedelta = dt.timedelta(minutes=10),
    team: str | None = None,
) -> dict:
    """A running job of 2 members × 2 GPUs on two nodes of a fleet whose policy is `action` (of `team`,
    when given: a team whose override turns the policy off)."""
    fleet = make_fleet(db)
    make_node(db, fleet, "n1", gpus=2)
    make_node(db, fleet, "n2", gpus=2)
    db.call(
        "set_idle_policy",
        admin,
        "gpu",
        None,
        dt.timedelta(minutes=30),
        5.0,
        0.2,
        action,
        grace,
    )
    owner = make_user(db, "alice")
    team_id = None
    if team:
        team_id = make_team(db, admin, team)
        db.call("set_team_member", admin, team_id, owner, "member")
        db.call("set_idle_policy", admin, "gpu", team_id, None, None, None, "off", None)
    job_id = make_job(db, owner, fleet, nodes=2, gpus_per_node=2, team_id=team_id)
    db.call("reserve_next", fleet)
    members = run_to_running(db, job_id)
    return {"id": job_id, "members": members, "owner": owner}


def feed(
    db: Database,
    gateway: GatewayThread,
    job: dict,
    readings: dict[tuple[int, int], Reading],
    start: float,
    end: float,
) -> None:
    """Samples of every (rank, gpu) named in `readings` from start to end (epoch seconds)."""
    for member in job["members"]:
        mine = {gpu: r for (rank, gpu), r in readings.items() if rank == member["rank"]}
        if mine:
            token = member_token(db, job["id"], 1, member["rank"])
            post_samples(gateway.url, token, mine, start, end)


def all_gpus(job: dict, reading: Reading) -> dict[tuple[int, int], Reading]:
    return {(m["rank"], g): reading for m in job["members"] for g in m["gpu_indices"]}


def sweep(db: Database, at: dt.datetime) -> dict:
    return db.call("sweep_idle_jobs", 100, at)[0]


def watch(db: Database, job_id: int) -> dict:
    return db.fetch_one("SELECT * FROM job_idle WHERE job_id = %s", (job_id,))


def reasons(db: Database, job_id: int) -> list[str]:
    return [
        r["reason"]
        for r in db.fetch_all("SELECT reason FROM job_events WHERE job_id = %s ORDER BY id", (job_id,))
    ]


def now_db(db: Database) -> dt.datetime:
    return db.fetch_one("SELECT now() AS t")["t"]


def idle_then_swept(
    db: Database, gateway: GatewayThread, job: dict, reading: Reading = IDLE, after: float = 0.0
) -> tuple[dt.datetime, dict]:
    """Every GPU of the job reads `reading` from 31 minutes ago until `after` seconds from now; one sweep
    now. Returns (now, the sweep's counts)."""
    t0 = now_db(db)
    feed(db, gateway, job, all_gpus(job, reading), t0.timestamp() - 31 * MIN, t0.timestamp() + after)
    return t0, sweep(db, t0)


def test_two_member_job_whose_four_gpus_are_idle_is_warned_then_reclaimed_after_the_grace(
    db: Database, gateway: GatewayThread, admin: int
) -> None:
    job = two_member_job(db, admin)
    t0, swept = idle_then_swept(db, gateway, job)
    assert swept["warned"] == 1
    deadline = t0 + dt.timedelta(minutes=10)
    reason = db.fetch_one("SELECT state, state_reason FROM jobs WHERE id = %s", (job["id"],))
    assert reason["state"] == "running"
    assert reason["state_reason"] == (
        "GPUs idle for 30 min (utilization < 5 %, power < 20 % on all 4 GPUs); it will be stopped at "
        f"{deadline.astimezone(dt.UTC):%H:%M} UTC unless they become busy"
    )
    w = watch(db, job["id"])
    assert (w["status"], w["deadline"], w["evaluation"]["idle"]) == ("idle", deadline, 4)
    assert w["idle_gpu_seconds"] == pytest.approx(4 * 30 * MIN)
    # The usage ledger carries the same seconds, per member (its 2 GPUs × 30 min).
    ledger = db.fetch_all(
        "SELECT idle_gpu_seconds FROM usage_ledger WHERE job_id = %s ORDER BY rank", (job["id"],)
    )
    assert [float(r["idle_gpu_seconds"]) for r in ledger] == pytest.approx([2 * 30 * MIN, 2 * 30 * MIN])
    # … which the usage report (the Usage page, its CSV, `tuneplane usage`) sums per job and per team.
    since = t0 - dt.timedelta(days=1)
    by_job = db.call("usage_report", admin, "job", None, since, None)
    (per_job,) = [r for r in by_job if r["job_id"] == job["id"]]
    (per_team,) = db.call("usage_report", admin, "team", "alice", since, None)
    idle = [float(per_job["idle_gpu_seconds"]), float(per_team["idle_gpu_seconds"])]
    assert idle == pytest.approx([4 * 30 * MIN, 4 * 30 * MIN])

    # Still idle within the grace: nothing more happens.
    feed(db, gateway, job, all_gpus(job, IDLE), t0.timestamp() + 10, t0.timestamp() + 11 * MIN)
    assert sweep(db, t0 + dt.timedelta(minutes=5))["reclaimed"] == 0
    # Still idle at the deadline: reclaimed through the preemption protocol: every member is asked to
    # checkpoint and stop (PREEMPT to its node) within the job's grace.
    assert sweep(db, t0 + dt.timedelta(minutes=11))["reclaimed"] == 1
    attempt = db.fetch_one("SELECT * FROM attempts WHERE job_id = %s", (job["id"],))
    assert (attempt["state"], attempt["stop_kind"]) == ("running", "preempted")
    assert attempt["stop_cause"].startswith(
        "GPUs idle for 41 min (utilization < 5 %, power < 20 % on all 4 GPUs)"
    )
    preempts = db.fetch_all("SELECT node_id FROM node_commands WHERE kind = 'preempt' ORDER BY node_id")
    assert [p["node_id"] for p in preempts] == sorted(m["node_id"] for m in job["members"])
    assert reasons(db, job["id"])[-1].startswith(
        "reclaimed (idle): GPUs idle for 41 min (utilization < 5 %, power < 20 % on all 4 GPUs); warned at "
    )
    assert watch(db, job["id"])["idle_gpu_seconds"] == pytest.approx(4 * 41 * MIN)
    # The members stop: the attempt is preempted, and the job ends (it was not submitted with
    # resume_when_idle_reclaimed); it is no longer watched.
    for member in job["members"]:
        report(db, "member_exited", member, exit_code=0)
    ended = db.fetch_one("SELECT state, state_reason FROM jobs WHERE id = %s", (job["id"],))
    assert ended["state"] == "cancelled"
    assert ended["state_reason"].startswith("attempt 1 preempted (idle): GPUs idle for 41 min")
    assert "not resumed: resubmit the job" in ended["state_reason"]
    assert db.fetch_one("SELECT state FROM attempts WHERE job_id = %s", (job["id"],))["state"] == "preempted"
    assert watch(db, job["id"])["watching"] is False
    assert sweep(db, t0 + dt.timedelta(minutes=20))["checked"] == 0


def test_a_job_submitted_with_resume_when_idle_reclaimed_is_queued_again_after_the_reclaim(
    db: Database, gateway: GatewayThread, admin: int
) -> None:
    job = two_member_job(db, admin, grace=dt.timedelta(0))
    db.fetch_all(
        "UPDATE jobs SET spec = spec || '{\"resume_when_idle_reclaimed\": true}' WHERE id = %s RETURNING 1",
        (job["id"],),
    )  # as confirm_preview copies it from the preview's resolved document
    t0, swept = idle_then_swept(db, gateway, job, after=5 * MIN)
    assert swept["warned"] == 1
    assert sweep(db, t0 + dt.timedelta(minutes=1))["reclaimed"] == 1
    for member in job["members"]:
        report(db, "member_exited", member, exit_code=0)
    queued = db.fetch_one("SELECT state, state_reason FROM jobs WHERE id = %s", (job["id"],))
    assert queued["state"] == "queued"
    assert queued["state_reason"].startswith("attempt 1 preempted (idle): GPUs idle for 31 min")
    assert queued["state_reason"].endswith(
        "queued for attempt 2 (preemptions do not count against max_attempts)"
    )


def test_one_busy_gpu_anywhere_in_the_job_keeps_it_unwarned(
    db: Database, gateway: GatewayThread, admin: int
) -> None:
    job = two_member_job(db, admin)
    t0 = now_db(db)
    readings = all_gpus(job, IDLE)
    rank1 = next(m for m in job["members"] if m["rank"] == 1)
    readings[(1, rank1["gpu_indices"][-1])] = BUSY  # the last GPU of the second member works
    feed(db, gateway, job, readings, t0.timestamp() - 31 * MIN, t0.timestamp())

    assert sweep(db, t0) == {"checked": 1, "warned": 0, "reclaimed": 0, "busy_again": 0}
    w = watch(db, job["id"])
    assert (w["status"], w["warned_at"], w["evaluation"]["busy"], w["evaluation"]["idle"]) == (
        "busy",
        None,
        1,
        3,
    )
    assert w["idle_gpu_seconds"] == 0


def test_samples_missing_for_part_of_the_window_never_make_a_job_idle(
    db: Database, gateway: GatewayThread, admin: int
) -> None:
    job = two_member_job(db, admin)
    t0 = now_db(db).timestamp()
    readings = all_gpus(job, IDLE)
    # Every GPU idle, but the samples of one GPU stop for 10 minutes in the middle of the window ...
    first = next(iter(readings))
    feed(db, gateway, job, {k: v for k, v in readings.items() if k != first}, t0 - 31 * MIN, t0)
    feed(db, gateway, job, {first: IDLE}, t0 - 31 * MIN, t0 - 20 * MIN)
    feed(db, gateway, job, {first: IDLE}, t0 - 10 * MIN, t0)
    assert sweep(db, dt.datetime.fromtimestamp(t0, dt.UTC))["warned"] == 0
    assert watch(db, job["id"])["status"] == "unknown"


def test_samples_that_began_within_the_window_leave_the_job_unknown(
    db: Database, gateway: GatewayThread, admin: int
) -> None:
    job = two_member_job(db, admin)
    t0 = now_db(db).timestamp()
    feed(db, gateway, job, all_gpus(job, IDLE), t0 - 20 * MIN, t0)  # 20 of the 30 minutes
    assert sweep(db, dt.datetime.fromtimestamp(t0, dt.UTC))["warned"] == 0
    w = watch(db, job["id"])
    assert (w["status"], w["evaluation"]["unknown"]) == ("unknown", 4)


def test_a_job_with_no_gpu_samples_is_unknown_never_idle(
    db: Database, gateway: GatewayThread, admin: int
) -> None:
    job = two_member_job(db, admin)
    t0 = now_db(db)
    assert sweep(db, t0 + dt.timedelta(hours=2))["warned"] == 0
    assert watch(db, job["id"])["status"] == "unknown"


def test_a_warned_job_that_becomes_busy_is_unwarned_and_its_timeline_says_so(
    db: Database, gateway: GatewayThread, admin: int
) -> None:
    job = two_member_job(db, admin)
    t0, swept = idle_then_swept(db, gateway, job)
    assert swept["warned"] == 1
    # One GPU gets to work two minutes later: the clock resets.
    rank0 = next(m for m in job["members"] if m["rank"] == 0)
    feed(
        db, gateway, job, {(0, rank0["gpu_indices"][0]): BUSY}, t0.timestamp() + 60, t0.timestamp() + 2 * MIN
    )
    assert sweep(db, t0 + dt.timedelta(minutes=2))["busy_again"] == 1
    w = watch(db, job["id"])
    assert (w["status"], w["warned_at"], w["deadline"], w["idle_since"]) == ("busy", None, None, None)
    assert reasons(db, job["id"])[-1] == (
        f"GPUs busy again (utilization up to 97 %); the idle warning of {t0.astimezone(dt.UTC):%H:%M} UTC is "
        "withdrawn"
    )
    # Past the old deadline nothing is reclaimed.
    assert sweep(db, t0 + dt.timedelta(minutes=12))["reclaimed"] == 0
    assert db.fetch_one("SELECT state FROM attempts WHERE job_id = %s", (job["id"],))["state"] == "running"


def test_an_exempt_job_is_never_reclaimed_and_the_exemption_is_recorded(
    db: Database, gateway: GatewayThread, admin: int
) -> None:
    job = two_member_job(db, admin)
    t0, swept = idle_then_swept(db, gateway, job, after=20 * MIN)
    assert swept["warned"] == 1

    with pytest.raises(Refusal, match="needs the admin role") as refused:
        db.call("exempt_job_idle", job["owner"], job["id"], "mine")
    assert (refused.value.status, refused.value.field) == (403, "actor")
    with pytest.raises(Refusal, match="a reason") as refused:
        db.call("exempt_job_idle", admin, job["id"], "  ")
    assert (refused.value.status, refused.value.field) == (400, "reason")
    db.call("exempt_job_idle", admin, job["id"], "interactive debugging session, approved by ops")
    assert reasons(db, job["id"])[-1] == (
        "exempt from the idle policy by root: interactive debugging session, approved by ops"
    )
    assert sweep(db, t0 + dt.timedelta(minutes=19)) == {
        "checked": 1,
        "warned": 0,
        "reclaimed": 0,
        "busy_again": 0,
    }
    w = watch(db, job["id"])
    assert (w["status"], w["deadline"], w["exempt_by"]) == ("idle", None, admin)
    assert db.fetch_one("SELECT state FROM attempts WHERE job_id = %s", (job["id"],))["state"] == "running"


def test_a_busy_looping_kernel_at_full_utilization_and_low_power_is_idle(
    db: Database, gateway: GatewayThread, admin: int
) -> None:
    job = two_member_job(db, admin, action="warn")
    spin = Reading(utilization=100.0, power_watts=90.0)  # NCCL waiting on a lost rank: 13 % of the limit
    assert idle_then_swept(db, gateway, job, spin)[1]["warned"] == 1
    assert db.fetch_one("SELECT state_reason FROM jobs WHERE id = %s", (job["id"],))["state_reason"].endswith(
        "on all 4 GPUs); this fleet's idle policy only warns: nothing will be stopped"
    )
    assert watch(db, job["id"])["deadline"] is None


def test_a_team_override_wins_over_the_fleet_policy_and_bad_values_are_refused(
    db: Database, admin: int
) -> None:
    make_fleet(db)
    vision, nlp = make_team(db, admin, "vision"), make_team(db, admin, "nlp")
    db.call("set_idle_policy", admin, "gpu", None, dt.timedelta(minutes=20), None, None, "reclaim", None)
    db.call("set_idle_policy", admin, "gpu", vision, None, 2.0, None, "warn", None)
    fleet = db.fetch_one("SELECT id FROM fleets WHERE name = 'gpu'")["id"]
    team = db.call("idle_policy_of", fleet, vision)[0]
    other = db.call("idle_policy_of", fleet, nlp)[0]
    assert (team["idle_after"], team["utilization_below"], team["action"]) == (
        dt.timedelta(minutes=20),
        2.0,
        "warn",
    )
    assert (other["utilization_below"], other["power_below"], other["action"]) == (5.0, 0.2, "reclaim")
    assert other["idle_grace"] == dt.timedelta(minutes=30)
    before = db.fetch_all("SELECT * FROM idle_policies ORDER BY id")
    for args, field, status in [
        ((None, None, None, 1.5, None, None), "power_below", 400),
        ((None, None, None, None, "kill", None), "action", 400),
        ((None, None, 0.0, None, None, None), "utilization_below", 400),
        ((None, dt.timedelta(0), None, None, None, None), "idle_after", 400),
    ]:
        with pytest.raises(Refusal) as refused:
            db.call("set_idle_policy", admin, "gpu", *args)
        assert (refused.value.field, refused.value.status) == (field, status)
    with pytest.raises(Refusal, match="no fleet"):
        db.call("set_idle_policy", admin, "nope", None, None, None, None, "warn", None)
    with pytest.raises(Refusal, match="admin role"):
        db.call("set_idle_policy", make_user(db, "bob"), "gpu", None, None, None, None, "off", None)
    assert db.fetch_all("SELECT * FROM idle_policies ORDER BY id") == before


def test_a_team_whose_override_turns_the_policy_off_is_measured_but_never_warned(
    db: Database, gateway: GatewayThread, admin: int
) -> None:
    job = two_member_job(db, admin, team="vision")
    assert idle_then_swept(db, gateway, job)[1]["warned"] == 0
    w = watch(db, job["id"])
    assert (w["status"], w["warned_at"], w["evaluation"]["action"]) == ("idle", None, "off")
    assert w["idle_gpu_seconds"] == pytest.approx(4 * 30 * MIN)


def test_a_job_is_evaluated_at_most_once_per_check_interval(
    db: Database, gateway: GatewayThread, admin: int
) -> None:
    job = two_member_job(db, admin)
    t0 = now_db(db)
    assert sweep(db, t0)["checked"] == 1
    assert sweep(db, t0 + dt.timedelta(seconds=30))["checked"] == 0
    assert sweep(db, t0 + dt.timedelta(minutes=1))["checked"] == 1
    assert watch(db, job["id"])["checked_at"] == t0 + dt.timedelta(minutes=1)


def test_the_warning_the_withdrawal_and_the_reclaim_each_queue_one_team_event(
    db: Database, gateway: GatewayThread, admin: int
) -> None:
    job = two_member_job(db, admin)
    db.call("create_team_webhook", job["owner"], "alice", "http://127.0.0.1:9/hook", "s" * 32, None)

    def kinds() -> list[str]:
        rows = db.fetch_all(
            "SELECT kind FROM team_event_deliveries WHERE job_id = %s ORDER BY id", (job["id"],)
        )
        return [r["kind"] for r in rows if r["kind"].startswith("job.idle")]

    t0, _ = idle_then_swept(db, gateway, job)
    rank0 = next(m for m in job["members"] if m["rank"] == 0)
    feed(
        db, gateway, job, {(0, rank0["gpu_indices"][0]): BUSY}, t0.timestamp() + 60, t0.timestamp() + 2 * MIN
    )
    sweep(db, t0 + dt.timedelta(minutes=1))  # still idle over its window: no second warning
    sweep(db, t0 + dt.timedelta(minutes=2))
    assert kinds() == ["job.idle_warning", "job.idle_withdrawn"]
    # Idle again for a whole window, warned again, reclaimed at the deadline.
    feed(db, gateway, job, all_gpus(job, IDLE), t0.timestamp() + 2 * MIN + 10, t0.timestamp() + 45 * MIN)
    sweep(db, t0 + dt.timedelta(minutes=33))
    sweep(db, t0 + dt.timedelta(minutes=44))
    assert kinds() == ["job.idle_warning", "job.idle_withdrawn", "job.idle_warning", "job.idle_reclaimed"]
    warning = db.fetch_one(
        "SELECT body FROM team_event_deliveries WHERE job_id = %s AND kind = 'job.idle_warning'"
        " ORDER BY id LIMIT 1",
        (job["id"],),
    )["body"]
    assert warning["data"]["message"].startswith("GPUs idle for 30 min (utilization < 5 %")
    assert warning["data"]["idle"] == 4 and warning["data"]["deadline"]


def test_an_exemption_in_flight_when_the_deadline_passes_wins_over_the_reclaim(
    db: Database, db_url: str, gateway: GatewayThread, admin: int
) -> None:
    """The exemption holds the job's row (uncommitted) while a sweep passes the deadline: the sweep skips the
    locked job rather than wait or reclaim it; once the exemption commits, no later sweep reclaims it."""
    job = two_member_job(db, admin)
    t0, swept = idle_then_swept(db, gateway, job, after=20 * MIN)
    assert swept["warned"] == 1
    with psycopg.connect(db_url, options="-c search_path=tuneplane,public") as other:
        other.execute("SELECT * FROM exempt_job_idle(%s, %s, %s)", (admin, job["id"], "demo for the board"))
        assert sweep(db, t0 + dt.timedelta(minutes=11)) == {
            "checked": 0,
            "warned": 0,
            "reclaimed": 0,
            "busy_again": 0,
        }
        other.commit()
    assert sweep(db, t0 + dt.timedelta(minutes=12))["reclaimed"] == 0
    assert db.fetch_one("SELECT state FROM attempts WHERE job_id = %s", (job["id"],))["state"] == "running"
    assert watch(db, job["id"])["exempt_reason"] == "demo for the board"
