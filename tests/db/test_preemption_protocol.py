"""The checkpoint grace protocol in SQL (docs/preemption.md): request_preemption asks a running attempt to
checkpoint and stop within its grace; the attempt ends `preempted` (or `timed_out`) whatever its exit
status, naming the checkpoint the next attempt resumes from and the work lost since it; preemptions do
not spend max_attempts; the grace's end sends STOP; time limits use the same request."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest
from psycopg.types.json import Jsonb

from tests.artifact_fixtures import (
    MemberSetup,
    give_credential,
    make_fleet_with,
    recorded_complete,
    write_tree,
)
from tests.launch_fixtures import make_job, make_node, make_user, members_of, report, run_to_running
from tuneplane.app.db import Database
from tuneplane.app.errors import Refusal


def execute(db: Database, query: str, params: tuple | dict = ()) -> None:
    with db.transaction() as conn:
        conn.execute(query, params)


def running_job(
    db: Database, *, gpus: int = 2, max_attempts: int = 1, spec: dict | None = None
) -> MemberSetup:
    user_id = make_user(db)
    fleet_id = make_fleet_with(db, "gpu", {"object_delivery": True})
    node_id = make_node(db, fleet_id, "gpu-node", gpus=4)
    credential, credential_hash = give_credential(db, node_id)
    job_id = make_job(db, user_id, fleet_id, gpus_per_node=gpus, max_attempts=max_attempts)
    if spec:
        execute(db, "UPDATE jobs SET spec = spec || %s WHERE id = %s", (Jsonb(spec), job_id))
    db.call("reserve_next", fleet_id, 1000)
    member = run_to_running(db, job_id)[0]
    return MemberSetup(user_id, fleet_id, node_id, job_id, member, credential, credential_hash)


def checkpoint(db: Database, setup: MemberSetup, tmp_path: Path, name: str, step: int | None = None) -> dict:
    manifest = write_tree(tmp_path / name, {"model.npz": name.encode()})
    return recorded_complete(db, setup, name, manifest, kind="checkpoint", step=step)


def attempt(db: Database, job_id: int, number: int = 1) -> dict:
    return db.fetch_one("SELECT * FROM attempts WHERE job_id = %s AND number = %s", (job_id, number))


def backdate(db: Database, setup: MemberSetup, seconds: float) -> None:
    """The attempt started `seconds` ago (test setup: time passing)."""
    execute(
        db,
        "UPDATE attempts SET running_at = running_at - %(ago)s, committed_at = committed_at - %(ago)s"
        " WHERE job_id = %(job)s",
        {"ago": dt.timedelta(seconds=seconds), "job": setup.job_id},
    )


def verified_ago(db: Database, artifact_id: int, seconds: float) -> None:
    """The checkpoint was verified `seconds` ago (test setup: a complete artifact is immutable, so its
    guard triggers are off for this one statement)."""
    with db.transaction() as conn:
        conn.execute("ALTER TABLE artifacts DISABLE TRIGGER USER")
        conn.execute(
            "UPDATE artifacts SET completed_at = now() - %s WHERE id = %s",
            (dt.timedelta(seconds=seconds), artifact_id),
        )
        conn.execute("ALTER TABLE artifacts ENABLE TRIGGER USER")


def preempt_commands(db: Database, setup: MemberSetup) -> list[dict]:
    return db.fetch_all(
        "SELECT payload FROM node_commands WHERE kind = 'preempt' AND node_id = %s ORDER BY id",
        (setup.node_id,),
    )


def test_a_request_sends_preempt_with_the_grace_and_the_jobs_signal(db: Database) -> None:
    setup = running_job(db, spec={"preemption": {"grace_seconds": 45, "signal": "SIGUSR1"}})
    row = db.call(
        "request_preemption", setup.job_id, "an urgent job needs the GPUs", None, "preempted", None
    )[0]
    assert row["stop_kind"] == "preempted"
    assert row["grace_deadline"] - row["stop_requested_at"] == dt.timedelta(seconds=45)
    (command,) = preempt_commands(db, setup)
    assert command["payload"]["signal"] == "SIGUSR1"
    assert command["payload"]["grace_seconds"] == 45
    assert command["payload"]["member_id"] == setup.member["id"]
    event = db.fetch_one(
        "SELECT reason FROM job_events WHERE job_id = %s ORDER BY id DESC LIMIT 1", (setup.job_id,)
    )
    assert "asked to checkpoint and stop: an urgent job needs the GPUs; grace 45 s" in event["reason"]
    # Asked again: nothing changes, the first deadline holds.
    again = db.call("request_preemption", setup.job_id, "again", dt.timedelta(seconds=1), "preempted", None)[
        0
    ]
    assert again["grace_deadline"] == row["grace_deadline"]
    assert len(preempt_commands(db, setup)) == 1


def test_the_grace_is_capped_by_the_fleets_maximum(db: Database) -> None:
    setup = running_job(db, spec={"preemption": {"grace_seconds": 3600}})
    execute(
        db, "UPDATE fleets SET max_preemption_grace = interval '90 seconds' WHERE id = %s", (setup.fleet_id,)
    )
    row = db.call("request_preemption", setup.job_id, "admin", dt.timedelta(hours=5), "preempted", None)[0]
    assert row["grace_deadline"] - row["stop_requested_at"] == dt.timedelta(seconds=90)


def test_a_fleets_maximum_above_the_installations_never_lengthens_a_jobs_own_grace(db: Database) -> None:
    """The cap is the fleet's max_preemption_grace, never above preemption_settings.max_grace (30 min;
    docs/preemption.md), for the grace a job gets of itself (the planner's preemptions, time limits) as for
    one given and the one checked at preview: one rule, preemption_grace_cap (the job's own grace took the
    fleet's maximum alone)."""
    setup = running_job(db, spec={"preemption": {"grace_seconds": 3600}})  # pinned before a lower cap
    execute(
        db, "UPDATE fleets SET max_preemption_grace = interval '2 hours' WHERE id = %s", (setup.fleet_id,)
    )
    row = db.call("request_preemption", setup.job_id, "urgent work", None, "preempted", None)[0]
    assert row["grace_deadline"] - row["stop_requested_at"] == dt.timedelta(minutes=30)


def test_a_checkpoint_verified_within_the_grace_ends_the_attempt_preempted_with_nothing_lost(
    db: Database, tmp_path: Path
) -> None:
    setup = running_job(db, max_attempts=1)
    checkpoint(db, setup, tmp_path, "checkpoint.1")
    db.call("request_preemption", setup.job_id, "urgent work", None, "preempted", None)
    saved = checkpoint(db, setup, tmp_path, "checkpoint.2")
    report(db, "member_exited", setup.member, exit_code=0)  # exit 0: still preempted, never succeeded
    a = attempt(db, setup.job_id)
    assert a["state"] == "preempted"
    assert a["end_checkpoint_id"] == saved["id"]
    # Measured (issue 35): the moment between the verification and the member's end, no more.
    assert a["lost_seconds"] < 1 and a["lost_gpu_seconds"] == pytest.approx(2 * a["lost_seconds"])
    assert "checkpoint checkpoint.2 verified" in a["reason"] and "lost 0 GPU-s (0.0 s) since" in a["reason"]
    job = db.fetch_one("SELECT * FROM jobs WHERE id = %s", (setup.job_id,))
    # max_attempts is 1 and the job is queued again: a preemption does not spend an attempt.
    assert job["state"] == "queued" and job["preemptions_used"] == 1
    assert "preemptions do not count against max_attempts" in job["state_reason"]


@pytest.mark.parametrize("gpus", [2, 0])
def test_a_workload_that_runs_on_after_its_checkpoint_in_the_grace_loses_the_work_after_it(
    db: Database, tmp_path: Path, gpus: int
) -> None:
    """Issue 35: a checkpoint completed inside the grace, but the workload went on for 20 s more before it
    ended: those 20 s are lost (the next attempt resumes from the checkpoint), not 0. A CPU-only job says it
    in seconds and CPU-seconds, not "0 GPU-s"."""
    setup = running_job(db, gpus=gpus, spec={"preemption": {"grace_seconds": 120}})
    backdate(db, setup, 600)
    db.call("request_preemption", setup.job_id, "urgent work", None, "preempted", None)
    saved = checkpoint(db, setup, tmp_path, "ckpt.1", step=500)
    # 20 s pass while the workload runs on (test setup: every time of the request and checkpoint moves back).
    verified_ago(db, saved["id"], 20)
    execute(
        db,
        "UPDATE attempts SET stop_requested_at = stop_requested_at - interval '20 s',"
        " grace_deadline = grace_deadline - interval '20 s' WHERE job_id = %s",
        (setup.job_id,),
    )
    report(db, "member_exited", setup.member, exit_code=0)
    a = attempt(db, setup.job_id)
    assert a["state"] == "preempted" and a["end_checkpoint_id"] == saved["id"]
    assert 20 <= a["lost_seconds"] < 30, a["lost_seconds"]
    assert a["lost_gpu_seconds"] == pytest.approx(gpus * a["lost_seconds"])
    words = db.call("job_attempt_preemption_of", setup.user_id, setup.job_id)[0]["lost"]
    assert words in a["reason"], (words, a["reason"])
    if gpus:
        assert words.startswith("lost 4") and "GPU-s (2" in words, words  # 2 GPUs × 20-odd s
    else:
        assert words.startswith("lost 2") and " s (2" in words and "CPU-s" in words and "GPU" not in words


def test_a_victim_without_a_new_checkpoint_loses_the_work_since_its_last_one(
    db: Database, tmp_path: Path
) -> None:
    setup = running_job(db, gpus=2)
    backdate(db, setup, 600)
    before = checkpoint(db, setup, tmp_path, "checkpoint.1")
    verified_ago(db, before["id"], 100)
    db.call("request_preemption", setup.job_id, "urgent work", dt.timedelta(seconds=0), "preempted", None)
    assert db.call("expire_grace_deadlines")[0]["expire_grace_deadlines"] == 1
    stop = db.fetch_one(
        "SELECT payload FROM node_commands WHERE kind = 'stop' AND node_id = %s", (setup.node_id,)
    )
    assert stop is not None
    report(db, "member_exited", setup.member, exit_code=-15)
    a = attempt(db, setup.job_id)
    assert a["state"] == "preempted" and a["end_checkpoint_id"] == before["id"]
    # 2 GPUs × the ~100 s since checkpoint.1 was verified (not the 600 s since the attempt started).
    assert 100 <= a["lost_seconds"] < 130
    assert a["lost_gpu_seconds"] == pytest.approx(2 * a["lost_seconds"])
    # The usage ledger records the same lost GPU-seconds for the attempt.
    ledger = db.fetch_one(
        "SELECT sum(lost_gpu_seconds) AS lost FROM usage_ledger WHERE attempt_id = %s", (a["id"],)
    )
    assert float(ledger["lost"]) == pytest.approx(a["lost_gpu_seconds"])
    assert "stopped at the end of its grace; resumes from checkpoint.1" in a["reason"]
    # The retry resumes from it.
    db.call("reserve_next", setup.fleet_id, 1000)
    run_to_running(db, setup.job_id)
    assert attempt(db, setup.job_id, 2)["resume_artifact_id"] == before["id"]


def test_the_words_name_each_checkpoint_with_the_step_the_workload_gave(db: Database, tmp_path: Path) -> None:
    """Issue 21 point 6: `checkpoint ckpt.3 (step 1200) verified 38 s into a 120 s grace`, `resumes from
    ckpt.2 (step 1000)`, and the job page's attempts name them so too."""
    setup = running_job(db, spec={"preemption": {"grace_seconds": 120}})
    checkpoint(db, setup, tmp_path, "ckpt.1", step=1000)
    db.call("request_preemption", setup.job_id, "urgent work", None, "preempted", None)
    checkpoint(db, setup, tmp_path, "ckpt.2", step=1200)
    report(db, "member_exited", setup.member, exit_code=0)
    first = attempt(db, setup.job_id)
    assert (
        "; checkpoint ckpt.2 (step 1200) verified 0 s into a 120 s grace; lost 0 GPU-s" in first["reason"]
    ), first["reason"]
    # Attempt 2 resumes from it: its timeline says so with the step; asked to stop, it makes none.
    db.call("reserve_next", setup.fleet_id, 1000)
    (member,) = run_to_running(db, setup.job_id)
    events = [
        e["reason"] for e in db.fetch_all("SELECT reason FROM job_events WHERE job_id = %s", (setup.job_id,))
    ]
    assert any(
        "attempt 2: preparing" in r and "; resumes from ckpt.2 (step 1200, verified " in r for r in events
    )
    db.call("request_preemption", setup.job_id, "again", dt.timedelta(seconds=0), "preempted", None)
    report(db, "member_exited", member, exit_code=-15)
    second = attempt(db, setup.job_id, 2)
    assert "; resumes from ckpt.2 (step 1200); lost " in second["reason"], second["reason"]
    rows = db.call("job_attempt_preemption_of", setup.user_id, setup.job_id)
    assert [(r["number"], r["resumed_from"], r["end_checkpoint"]) for r in rows] == [
        (2, "ckpt.2 (step 1200)", "ckpt.2 (step 1200)"),
        (1, None, "ckpt.2 (step 1200)"),
    ]


def test_a_checkpoint_without_a_step_is_named_alone(db: Database, tmp_path: Path) -> None:
    setup = running_job(db)
    db.call("request_preemption", setup.job_id, "urgent work", None, "preempted", None)
    checkpoint(db, setup, tmp_path, "ckpt.1")
    report(db, "member_exited", setup.member, exit_code=0)
    assert "; checkpoint ckpt.1 verified 0 s into a " in attempt(db, setup.job_id)["reason"]
    (row,) = db.call("job_attempt_preemption_of", setup.user_id, setup.job_id)
    assert row["end_checkpoint"] == "ckpt.1"


def test_without_any_checkpoint_everything_since_the_start_is_lost(db: Database) -> None:
    setup = running_job(db, gpus=1)
    backdate(db, setup, 50)
    db.call("request_preemption", setup.job_id, "urgent", None, "preempted", None)
    report(db, "member_exited", setup.member, exit_code=1)
    a = attempt(db, setup.job_id)
    assert a["state"] == "preempted" and a["end_checkpoint_id"] is None
    assert 50 <= a["lost_gpu_seconds"] < 80
    assert "no verified checkpoint: the next attempt starts from scratch" in a["reason"]


def test_a_time_limit_asks_the_same_and_ends_timed_out_spending_an_attempt(
    db: Database, tmp_path: Path
) -> None:
    setup = running_job(db, max_attempts=2, spec={"resources": {"time_limit_minutes": 1}})
    assert db.call("expire_time_limits")[0]["expire_time_limits"] == 0  # not yet
    backdate(db, setup, 61)
    assert db.call("expire_time_limits")[0]["expire_time_limits"] == 1
    assert db.call("expire_time_limits")[0]["expire_time_limits"] == 0  # asked once
    (command,) = preempt_commands(db, setup)
    assert command["payload"]["kind"] == "timed_out"
    saved = checkpoint(db, setup, tmp_path, "checkpoint.1")
    report(db, "member_exited", setup.member, exit_code=0)
    a = attempt(db, setup.job_id)
    assert a["state"] == "timed_out" and a["end_checkpoint_id"] == saved["id"]
    assert "its time limit of 1 min was reached" in a["reason"]
    job = db.fetch_one(
        "SELECT state, state_reason, preemptions_used FROM jobs WHERE id = %s", (setup.job_id,)
    )
    assert job["state"] == "queued" and job["preemptions_used"] == 0
    assert job["state_reason"].startswith("attempt 1 of 2 timed out")


def test_a_request_before_anything_started_aborts_the_launch_and_ends_preempted(db: Database) -> None:
    user_id = make_user(db)
    fleet_id = make_fleet_with(db, "gpu", {"object_delivery": True})
    make_node(db, fleet_id, "gpu-node", gpus=4)
    job_id = make_job(db, user_id, fleet_id)
    db.call("reserve_next", fleet_id, 1000)
    db.call("request_preemption", job_id, "urgent", None, "preempted", None)
    a = attempt(db, job_id)
    assert a["state"] == "preempted" and a["lost_gpu_seconds"] == 0
    assert "stopped before it started" in a["reason"]
    assert db.fetch_one("SELECT state FROM jobs WHERE id = %s", (job_id,))["state"] == "queued"
    assert all(m["released_at"] is not None for m in members_of(db, job_id))


def test_cancel_during_the_grace_wins(db: Database) -> None:
    setup = running_job(db)
    db.call("request_preemption", setup.job_id, "urgent", None, "preempted", None)
    db.call("cancel_job", setup.job_id, setup.user_id, "changed my mind")
    report(db, "member_exited", setup.member, exit_code=-15)
    assert attempt(db, setup.job_id)["state"] == "cancelled"
    assert db.fetch_one("SELECT state FROM jobs WHERE id = %s", (setup.job_id,))["state"] == "cancelled"


@pytest.mark.parametrize(
    ("args", "status", "field"),
    [
        (("reason", None, "finished"), 400, "kind"),
        (("reason", dt.timedelta(seconds=-1), "preempted"), 422, "grace"),
        (("", None, "preempted"), 400, "reason"),
    ],
)
def test_bad_requests_are_refused_naming_the_field(
    db: Database, args: tuple, status: int, field: str
) -> None:
    setup = running_job(db)
    with pytest.raises(Refusal) as refused:
        db.call("request_preemption", setup.job_id, *args, None)
    assert (refused.value.status, refused.value.field) == (status, field)
    assert attempt(db, setup.job_id)["stop_kind"] is None


def test_a_job_without_a_live_attempt_is_refused(db: Database) -> None:
    user_id = make_user(db)
    fleet_id = make_fleet_with(db, "gpu", {"object_delivery": True})
    job_id = make_job(db, user_id, fleet_id)
    with pytest.raises(Refusal) as refused:
        db.call("request_preemption", job_id, "urgent", None, "preempted", None)
    assert refused.value.status == 409 and "has no running attempt (it is queued)" in refused.value.message
    with pytest.raises(Refusal) as unknown:
        db.call("request_preemption", 987654, "urgent", None, "preempted", None)
    assert unknown.value.status == 404


def test_a_failed_attempt_records_the_work_lost_since_the_last_checkpoint(
    db: Database, tmp_path: Path
) -> None:
    setup = running_job(db, gpus=2, max_attempts=2)
    backdate(db, setup, 300)
    ckpt = checkpoint(db, setup, tmp_path, "checkpoint.1")
    verified_ago(db, ckpt["id"], 40)
    report(db, "member_exited", setup.member, exit_code=1)
    a = attempt(db, setup.job_id)
    assert a["state"] == "failed" and a["end_checkpoint_id"] == ckpt["id"]
    assert 40 <= a["lost_seconds"] < 70 and a["lost_gpu_seconds"] == pytest.approx(2 * a["lost_seconds"])
    ledger = db.fetch_one(
        "SELECT sum(lost_gpu_seconds) AS lost FROM usage_ledger WHERE attempt_id = %s", (a["id"],)
    )
    assert float(ledger["lost"]) == pytest.approx(a["lost_gpu_seconds"])


def test_scavenger_work_is_charged_nothing(db: Database) -> None:
    user_id = make_user(db)
    fleet_id = make_fleet_with(db, "gpu", {"object_delivery": True})
    make_node(db, fleet_id, "gpu-node", gpus=4)
    scavenger = make_job(db, user_id, fleet_id, priority=-100)
    normal = make_job(db, user_id, fleet_id)
    execute(db, "UPDATE jobs SET priority_class = 'scavenger' WHERE id = %s", (scavenger,))
    db.call("reserve_next", fleet_id, 1000)
    rows = db.fetch_all("SELECT job_id, charge_factor FROM usage_ledger ORDER BY job_id")
    assert {r["job_id"]: float(r["charge_factor"]) for r in rows} == {scavenger: 0.0, normal: 1.0}
