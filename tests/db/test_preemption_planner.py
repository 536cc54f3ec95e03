"""The preemption planner inside reserve_next (docs/preemption.md, "The planner"): a job that does not
fit preempts lower-priority preemptible work — one decision row, the victims asked to checkpoint and stop,
their nodes held for it until it is reserved — and never a non-preemptible job, a job of equal priority,
one younger than min_runtime or one past its max_preemptions."""

from __future__ import annotations

import datetime as dt

import psycopg
from psycopg.types.json import Jsonb

from tests.launch_fixtures import (
    assert_no_gpu_allocated_twice,
    make_fleet,
    make_job,
    make_node,
    make_user,
    members_of,
    report,
    run_to_running,
)
from tuneplane.app.db import Database


def execute(db: Database, query: str, params: tuple | dict = ()) -> None:
    with db.transaction() as conn:
        conn.execute(query, params)


def job_with(db: Database, user: int, fleet: int, gpus: int, priority: int, preemptible: bool, **spec) -> int:
    job_id = make_job(db, user, fleet, gpus_per_node=gpus, priority=priority)
    execute(
        db,
        "UPDATE jobs SET preemptible = %s, spec = spec || %s WHERE id = %s",
        (preemptible, Jsonb(spec), job_id),
    )
    return job_id


def run(db: Database, fleet: int, job_id: int, ran_for: float = 3600) -> dict:
    db.call("reserve_next", fleet, 1000)
    member = run_to_running(db, job_id)[0]
    execute(
        db,
        "UPDATE attempts SET running_at = running_at - %(ago)s, committed_at = committed_at - %(ago)s"
        " WHERE job_id = %(job)s",
        {"ago": dt.timedelta(seconds=ran_for), "job": job_id},
    )
    return member


def asked(db: Database, job_id: int) -> bool:
    row = db.fetch_one(
        "SELECT stop_kind FROM attempts WHERE job_id = %s ORDER BY number DESC LIMIT 1", (job_id,)
    )
    return row is not None and row["stop_kind"] == "preempted"


def setup(db: Database) -> tuple[int, int, int]:
    user = make_user(db)
    fleet = make_fleet(db)
    node = make_node(db, fleet, "n1", gpus=4)
    return user, fleet, node


def test_an_urgent_job_preempts_lower_priority_work_and_its_room_is_held_until_it_is_reserved(
    db: Database,
) -> None:
    user, fleet, node = setup(db)
    victim = job_with(db, user, fleet, 4, 0, True)
    victim_member = run(db, fleet, victim)
    urgent = job_with(db, user, fleet, 2, 100, False)
    small = job_with(db, user, fleet, 1, 0, True)
    db.call("reserve_next", fleet, 1000)
    assert asked(db, victim)
    decision = db.fetch_one("SELECT * FROM preemptions WHERE preemptor_job_id = %s", (urgent,))
    assert (
        decision["state"] == "holding"
        and decision["held_node_ids"] == [node]
        and decision["rule"] == "priority"
    )
    victims = db.fetch_all("SELECT * FROM preemption_victims WHERE preemption_id = %s", (decision["id"],))
    assert [(v["job_id"], v["gpus"]) for v in victims] == [(victim, 4)]
    assert victims[0]["expected_lost_gpu_seconds"] >= 4 * 3600
    reason = db.fetch_one("SELECT state_reason FROM jobs WHERE id = %s", (urgent,))["state_reason"]
    assert f"preempting job(s) {victim} on n1" in reason
    # Another pass while the victim checkpoints plans nothing new and asks nothing twice.
    db.call("reserve_next", fleet, 1000)
    assert db.fetch_one("SELECT count(*) AS n FROM preemptions")["n"] == 1
    assert db.fetch_one("SELECT count(*) AS n FROM node_commands WHERE kind = 'preempt'")["n"] == 1

    # The victim stops; in the pass that follows the urgent job's row is held by someone else (skipped):
    # the freed GPUs still go to nobody else.
    report(db, "member_exited", victim_member, exit_code=0)
    with psycopg.connect(db.url, autocommit=False) as other:
        other.execute("SELECT 1 FROM tuneplane.jobs WHERE id = %s FOR UPDATE", (urgent,))
        db.call("reserve_next", fleet, 1000)
        other.rollback()
    assert members_of(db, small) == []
    assert db.fetch_one("SELECT state FROM jobs WHERE id = %s", (victim,))["state"] == "queued"
    placed = {r["job_id"] for r in db.call("reserve_next", fleet, 1000)}
    assert urgent in placed
    assert db.fetch_one("SELECT state FROM preemptions WHERE id = %s", (decision["id"],))["state"] == "done"
    # Now the rest is anyone's again (the small job waits behind the victim, the head, by the backfill rule).
    db.call("reserve_next", fleet, 1000)
    assert (
        f"behind job {victim}"
        in db.fetch_one("SELECT state_reason FROM jobs WHERE id = %s", (small,))["state_reason"]
    )
    assert_no_gpu_allocated_twice(db)


def test_victims_lose_the_least_work_and_scavengers_go_first(db: Database) -> None:
    user, fleet, _ = setup(db)
    execute(db, "UPDATE jobs SET priority_class = NULL")
    long_run = job_with(db, user, fleet, 1, -10, True)
    run(db, fleet, long_run, ran_for=7200)
    short_run = job_with(db, user, fleet, 1, -10, True)
    run(db, fleet, short_run, ran_for=600)
    scavenger = job_with(db, user, fleet, 1, -100, True)
    run(db, fleet, scavenger, ran_for=9000)
    execute(db, "UPDATE jobs SET priority_class = 'scavenger' WHERE id = %s", (scavenger,))
    busy = job_with(db, user, fleet, 1, -10, True)
    run(db, fleet, busy, ran_for=8000)
    urgent = job_with(db, user, fleet, 2, 100, False)
    db.call("reserve_next", fleet, 1000)
    assert asked(db, scavenger) and asked(db, short_run)
    assert not asked(db, long_run) and not asked(db, busy)
    assert urgent


def test_never_a_non_preemptible_job_an_equal_priority_one_a_young_one_or_one_past_its_budget(
    db: Database,
) -> None:
    user, fleet, _ = setup(db)
    pinned = job_with(db, user, fleet, 1, 0, False)
    run(db, fleet, pinned)
    equal = job_with(db, user, fleet, 1, 100, True)
    run(db, fleet, equal)
    young = job_with(db, user, fleet, 1, 0, True)
    run(db, fleet, young, ran_for=10)  # under min_runtime (5 min)
    spent = job_with(db, user, fleet, 1, 0, True, preemption={"max_preemptions": 1})
    run(db, fleet, spent)
    execute(db, "UPDATE jobs SET preemptions_used = 1 WHERE id = %s", (spent,))
    urgent = job_with(db, user, fleet, 1, 100, False)
    db.call("reserve_next", fleet, 1000)
    assert not any(asked(db, j) for j in (pinned, equal, young, spent))
    assert db.fetch_one("SELECT count(*) AS n FROM preemptions")["n"] == 0
    reason = db.fetch_one("SELECT state_reason FROM jobs WHERE id = %s", (urgent,))["state_reason"]
    assert "preempting" not in reason
    assert f"no job can be preempted for it yet: job {young} can be preempted at" in reason, reason


def test_a_preemptor_waiting_for_min_runtime_is_told_which_job_and_when_in_numbers(db: Database) -> None:
    """Issue 35: a victim younger than min_runtime cannot be taken yet; the urgent job's reason says which
    job and when it can be (its start + min_runtime), not only "waiting for capacity to free up"."""
    user, fleet, _ = setup(db)
    young = job_with(db, user, fleet, 4, 0, True)
    run(db, fleet, young, ran_for=60)
    urgent = job_with(db, user, fleet, 2, 100, False)
    db.call("reserve_next", fleet, 1000)
    assert not asked(db, young)
    started = db.fetch_one("SELECT running_at FROM attempts WHERE job_id = %s", (young,))["running_at"]
    at = (started + dt.timedelta(minutes=5)).astimezone(dt.UTC).strftime("%H:%M:%S")
    reason = db.fetch_one("SELECT state_reason FROM jobs WHERE id = %s", (urgent,))["state_reason"]
    assert (
        f"; no job can be preempted for it yet: job {young} can be preempted at {at} (min runtime 5 min)"
        in reason
    ), reason
    # Once it has run min_runtime, the planner takes it.
    execute(db, "UPDATE attempts SET running_at = running_at - interval '5 min' WHERE job_id = %s", (young,))
    db.call("reserve_next", fleet, 1000)
    assert asked(db, young)


def test_a_preemptor_is_told_when_the_only_victim_spent_its_max_preemptions(db: Database) -> None:
    user, fleet, _ = setup(db)
    spent = job_with(db, user, fleet, 4, 0, True, preemption={"max_preemptions": 2})
    run(db, fleet, spent)
    execute(db, "UPDATE jobs SET preemptions_used = 2 WHERE id = %s", (spent,))
    urgent = job_with(db, user, fleet, 2, 100, False)
    db.call("reserve_next", fleet, 1000)
    reason = db.fetch_one("SELECT state_reason FROM jobs WHERE id = %s", (urgent,))["state_reason"]
    assert (
        f"no job can be preempted for it: job {spent} was preempted 2 time(s), its max_preemptions" in reason
    )


def test_a_cpu_only_job_preempts_for_cpus(db: Database) -> None:
    user = make_user(db)
    fleet = make_fleet(db)
    make_node(db, fleet, "cpu1", gpus=0, cpus=8)
    victim = make_job(db, user, fleet, gpus_per_node=0, cpus_per_node=6)
    execute(db, "UPDATE jobs SET preemptible = true WHERE id = %s", (victim,))
    run(db, fleet, victim)
    urgent = make_job(db, user, fleet, gpus_per_node=0, cpus_per_node=4, priority=100)
    db.call("reserve_next", fleet, 1000)
    assert asked(db, victim)
    assert (
        db.fetch_one("SELECT count(*) AS n FROM preemptions WHERE preemptor_job_id = %s", (urgent,))["n"] == 1
    )


def test_a_cancelled_preemptor_releases_its_hold(db: Database) -> None:
    user, fleet, node = setup(db)
    victim = job_with(db, user, fleet, 4, 0, True)
    member = run(db, fleet, victim)
    urgent = job_with(db, user, fleet, 4, 100, False)
    db.call("reserve_next", fleet, 1000)
    db.call("cancel_job", urgent, user, "not needed")
    report(db, "member_exited", member, exit_code=0)
    db.call("reserve_next", fleet, 1000)
    assert db.fetch_one("SELECT state FROM preemptions")["state"] == "dropped"
    assert db.fetch_one("SELECT state FROM jobs WHERE id = %s", (victim,))["state"] == "reserved"
    assert node


def test_a_preempted_job_backs_off_while_a_job_that_outranks_it_waits(db: Database) -> None:
    user, fleet, _ = setup(db)
    victim = job_with(db, user, fleet, 1, 0, True)
    member = run(db, fleet, victim)
    blocker = job_with(db, user, fleet, 2, 0, False)
    run(db, fleet, blocker)
    make_node(db, fleet, "n2", gpus=1)  # room for the victim alone, not for the urgent job
    urgent = job_with(db, user, fleet, 2, 100, False)
    db.call("reserve_next", fleet, 1000)
    assert asked(db, victim)
    report(db, "member_exited", member, exit_code=0)  # preempted; n1 is held for the urgent job
    with psycopg.connect(db.url, autocommit=False) as other:  # the urgent job is skipped in this pass
        other.execute("SELECT 1 FROM tuneplane.jobs WHERE id = %s FOR UPDATE", (urgent,))
        db.call("reserve_next", fleet, 1000)
        other.rollback()
    job = db.fetch_one("SELECT state, state_reason FROM jobs WHERE id = %s", (victim,))
    assert job["state"] == "queued" and "backing off until" in job["state_reason"], job
    assert f"while job {urgent} (priority 100) waits" in job["state_reason"]
    assert len(members_of(db, victim)) == 1  # not placed on n2, where it would be preempted again
    db.call("reserve_next", fleet, 1000)  # the urgent job is placed; the victim may go to n2 now
    db.call("reserve_next", fleet, 1000)
    assert db.fetch_one("SELECT state FROM jobs WHERE id = %s", (victim,))["state"] == "reserved"
