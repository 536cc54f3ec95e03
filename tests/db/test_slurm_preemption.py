"""Slurm fleets in the checkpoint grace protocol (docs/preemption.md, "Slurm fleets"): a request to
checkpoint and stop becomes due for the worker to deliver (slurm_preemptions_due); an attempt asked to stop
ends `preempted` / `timed_out` whatever its exit status; Slurm's own PREEMPTED and TIMEOUT end an attempt
`preempted` / `timed_out` (never failed, never succeeded) and the retry resumes from the last verified
checkpoint (slurm_allocation_started chooses it)."""

from __future__ import annotations

import datetime as dt
import json
import time
from dataclasses import dataclass

import pytest
from psycopg.types.json import Jsonb

from tests.artifact_fixtures import give_credential
from tests.launch_fixtures import make_job, make_user
from tuneplane.app.db import Database
from tuneplane.workers.artifacts.manifest import Manifest

SHARED = "/shared/tp"


@dataclass
class Running:
    fleet_id: int
    job_id: int
    attempt_id: int
    member_id: int
    credential_hash: str


def execute(db: Database, query: str, params: tuple = ()) -> None:
    with db.transaction() as conn:
        conn.execute(query, params)


def slurm_fleet(db: Database, nodes: tuple[str, ...] = ("s1",)) -> int:
    fleet = db.call("create_slurm_fleet", "hpc", "batch", None, json.dumps({"shared_path": SHARED}))[0]["id"]
    status = {"version": "22.05.8", "partition": {"max_nodes": 2, "max_time_minutes": 60},
              "nodes": [{"name": n, "address": "127.0.0.1", "state": "idle", "reason": None, "cpus": 8,
                         "memory_mb": 1000, "gpus": 2, "gpu_model": "gpu"} for n in nodes]}  # fmt: skip
    db.call("slurm_sync_fleet", fleet, json.dumps(status))
    return fleet


def run_attempt(db: Database, fleet_id: int, job_id: int, slurm_job_id: int) -> int:
    """The next attempt of a queued job, submitted, allocated on s1, committed and running."""
    due = next(d for d in db.call("slurm_submissions_due", fleet_id) if d["job_id"] == job_id)
    attempt_id = due["attempt_id"]
    db.call("slurm_submitted", attempt_id, slurm_job_id)
    db.call("slurm_allocation_started", attempt_id, ["s1"], 29500, "0" * 64)
    assert db.call("slurm_member_prepared", attempt_id, 0)[0]["slurm_member_prepared"] == "commit"
    db.call("slurm_member_started", attempt_id, 0, 4242)
    return attempt_id


def running(db: Database, *, max_attempts: int = 1, spec: dict | None = None) -> Running:
    fleet_id = slurm_fleet(db)
    job_id = make_job(db, make_user(db), fleet_id, gpus_per_node=1, max_attempts=max_attempts)
    if spec:
        execute(db, "UPDATE jobs SET spec = spec || %s WHERE id = %s", (Jsonb(spec), job_id))
    attempt_id = run_attempt(db, fleet_id, job_id, 100)
    member = db.fetch_one("SELECT * FROM members WHERE attempt_id = %s", (attempt_id,))
    _, credential_hash = give_credential(db, member["node_id"])
    return Running(fleet_id, job_id, attempt_id, member["id"], credential_hash)


def attempt(db: Database, attempt_id: int) -> dict:
    return db.fetch_one("SELECT * FROM attempts WHERE id = %s", (attempt_id,))


def job(db: Database, job_id: int) -> dict:
    return db.fetch_one("SELECT * FROM jobs WHERE id = %s", (job_id,))


def member_of(db: Database, attempt_id: int) -> dict:
    return db.fetch_one("SELECT * FROM members WHERE attempt_id = %s", (attempt_id,))


def complete_checkpoint(db: Database, r: Running, name: str) -> dict:
    """A checkpoint of the running member delivered `shared`, made complete at the database level."""
    manifest = Manifest.from_json(
        {"version": 1, "files": [{"path": "state.json", "size": 2, "sha256": "a" * 64}]}
    )
    path = f"{SHARED}/attempts/{r.attempt_id}/members/0/output/checkpoints/{name}"
    art = db.call(
        "register_artifact", r.credential_hash, r.member_id, name, "checkpoint", "shared",
        Jsonb(manifest.as_json()), manifest.digest, path,
    )[0]  # fmt: skip
    for index, entry in enumerate(manifest.files):
        art = db.call("record_artifact_file", r.credential_hash, art["id"], index, entry.sha256, entry.size)[
            0
        ]
    assert art["state"] == "complete", art
    return art


def test_a_request_is_due_for_the_worker_once_every_member_runs_and_delivered_once(db: Database) -> None:
    r = running(db, spec={"preemption": {"signal": "SIGUSR1", "grace_seconds": 90}})
    assert db.call("slurm_preemptions_due", r.fleet_id) == []
    db.call("request_preemption", r.job_id, "preempted by admin root", None, "preempted", None)
    due = db.call("slurm_preemptions_due", r.fleet_id)
    assert [(d["attempt_id"], d["slurm_job_id"]) for d in due] == [(r.attempt_id, 100)]
    request = due[0]["request"]
    assert (request["kind"], request["signal"], request["reason"]) == (
        "preempted",
        "SIGUSR1",
        "preempted by admin root",
    )
    assert request["grace_seconds"] == pytest.approx(90)
    assert request["deadline"] == pytest.approx(attempt(db, r.attempt_id)["grace_deadline"].timestamp())
    # The request event counts the member the worker will tell (no node agent: no PREEMPT command).
    events = [e["reason"] for e in db.fetch_all("SELECT reason FROM job_events WHERE job_id = %s ORDER BY id",
                                                (r.job_id,))]  # fmt: skip
    assert any("asked to checkpoint and stop" in e and "SIGUSR1 to 1 member(s)" in e for e in events), events
    assert db.fetch_one("SELECT count(*) AS n FROM node_commands WHERE kind = 'preempt'")["n"] == 0
    db.call("slurm_preemption_signalled", r.attempt_id, "SIGUSR1", 1)
    db.call("slurm_preemption_signalled", r.attempt_id, "SIGUSR1", 1)  # twice: one event
    assert db.call("slurm_preemptions_due", r.fleet_id) == []
    delivered = db.fetch_all(
        "SELECT reason FROM job_events WHERE job_id = %s AND detail ->> 'kind' = 'stop_request_delivered'",
        (r.job_id,),
    )
    assert len(delivered) == 1 and "SIGUSR1 sent to the steps of Slurm job 100" in delivered[0]["reason"]
    # While it checkpoints the Slurm job is not cancelled: only at the grace's end.
    assert db.call("slurm_scancel_due", r.fleet_id) == []


def test_a_member_still_starting_holds_the_delivery_back(db: Database) -> None:
    fleet_id = slurm_fleet(db)
    job_id = make_job(db, make_user(db), fleet_id, gpus_per_node=1)
    due = db.call("slurm_submissions_due", fleet_id)[0]
    db.call("slurm_submitted", due["attempt_id"], 7)
    db.call("slurm_allocation_started", due["attempt_id"], ["s1"], 29500, "0" * 64)
    db.call("slurm_member_prepared", due["attempt_id"], 0)
    assert member_of(db, due["attempt_id"])["state"] == "starting"
    execute(
        db, "UPDATE attempts SET state = 'running' WHERE id = %s", (due["attempt_id"],)
    )  # racing the step
    db.call("request_preemption", job_id, "preempted by admin root", None, "preempted", None)
    assert db.call("slurm_preemptions_due", fleet_id) == []


def test_an_attempt_asked_to_stop_whose_workload_trapped_the_signal_and_exited_0_is_preempted(
    db: Database,
) -> None:
    r = running(db)
    db.call("request_preemption", r.job_id, "preempted by admin root", None, "preempted", None)
    db.call("slurm_preemption_signalled", r.attempt_id, "SIGTERM", 1)
    ck = complete_checkpoint(db, r, "checkpoint.1")  # published within the grace
    # The step saw the signal; the worker waited for Slurm's end state: COMPLETED (the script exited 0).
    state = db.call("slurm_member_exited", r.attempt_id, 0, 0, "exited with status 0", True, "COMPLETED",
                    time.time())[0]["slurm_member_exited"]  # fmt: skip
    assert state == "exited"  # the workload's own status: it was TunePlane's signal
    a = attempt(db, r.attempt_id)
    assert a["state"] == "preempted", a["reason"]
    assert a["end_checkpoint_id"] == ck["id"] and a["lost_seconds"] < 1  # measured: the moment to its end
    assert "checkpoint checkpoint.1 verified" in a["reason"] and "lost 0 GPU-s" in a["reason"]
    j = job(db, r.job_id)
    assert j["state"] == "queued" and j["preemptions_used"] == 1, j["state_reason"]
    assert "preemptions do not count against max_attempts" in j["state_reason"]
    db.call("slurm_job_ended", r.attempt_id, "COMPLETED", "Slurm job 100 COMPLETED")
    assert attempt(db, r.attempt_id)["state"] == "preempted"
    # The retry resumes from that checkpoint: chosen when Slurm allocates it, carried by resume_pin.
    second = run_attempt(db, r.fleet_id, r.job_id, 101)
    assert attempt(db, second)["resume_artifact_id"] == ck["id"]
    pin = db.call("resume_pin", second)[0]["resume_pin"]
    assert (pin["name"], pin["delivery"], pin["manifest_digest"]) == (
        "checkpoint.1",
        "shared",
        ck["manifest_digest"],
    )
    assert pin["shared_path"].endswith("/members/0/output/checkpoints/checkpoint.1")
    events = [e["reason"] for e in db.fetch_all("SELECT reason FROM job_events WHERE job_id = %s ORDER BY id",
                                                (r.job_id,))]  # fmt: skip
    assert any("Slurm allocated s1" in e and "resumes from checkpoint.1" in e for e in events), events


def test_a_workload_that_fails_after_the_request_still_ends_preempted_naming_the_request(
    db: Database,
) -> None:
    r = running(db)
    db.call("request_preemption", r.job_id, "preempted by admin root", None, "preempted", None)
    db.call("slurm_member_exited", r.attempt_id, 0, -15, "killed by SIGTERM", True, "CANCELLED", None)
    m = member_of(db, r.attempt_id)
    assert m["state"] == "failed" and "after the request to checkpoint and stop" in m["reason"], m["reason"]
    assert attempt(db, r.attempt_id)["state"] == "preempted"


@pytest.mark.parametrize(
    ("slurm_state", "kind", "words"),
    [
        ("PREEMPTED", "preempted", "preempted by Slurm (PREEMPTED)"),
        ("COMPLETED", "preempted", "stopped by a signal TunePlane did not send"),
        ("TIMEOUT", "timed_out", "time limit reached: Slurm reported TIMEOUT"),
    ],
)
def test_slurms_own_stop_of_a_workload_that_trapped_it_and_exited_0_is_preempted_or_timed_out(
    db: Database, slurm_state: str, kind: str, words: str
) -> None:
    r = running(db, max_attempts=2)
    signalled_at = time.time() - 5
    db.call(
        "slurm_member_exited", r.attempt_id, 0, 0, "exited with status 0", True, slurm_state, signalled_at
    )
    a = attempt(db, r.attempt_id)
    assert a["state"] == kind, a["reason"]
    assert a["stop_kind"] == kind and words in a["stop_cause"]
    assert abs(a["stop_requested_at"].timestamp() - signalled_at) < 0.01  # when Slurm's signal came
    assert member_of(db, r.attempt_id)["state"] == "exited"
    j = job(db, r.job_id)
    assert j["state"] == "queued", j["state_reason"]
    assert j["preemptions_used"] == (1 if kind == "preempted" else 0)


def test_slurms_timeout_of_a_member_that_never_wrote_its_status_ends_timed_out_and_counts(
    db: Database,
) -> None:
    r = running(db, max_attempts=1)
    assert (
        db.call("slurm_job_ended", r.attempt_id, "TIMEOUT", "Slurm job 100 TIMEOUT")[0]["slurm_job_ended"]
        == "timed_out"
    )
    m = member_of(db, r.attempt_id)
    assert m["state"] == "failed" and "time limit reached" in m["reason"]
    j = job(db, r.job_id)
    assert j["state"] == "failed" and "timed out" in j["state_reason"], j["state_reason"]


def test_slurm_preempting_a_job_past_its_max_preemptions_fails_it_instead_of_looping(db: Database) -> None:
    r = running(db, max_attempts=1, spec={"preemption": {"max_preemptions": 0}})
    db.call("slurm_job_ended", r.attempt_id, "PREEMPTED", "Slurm job 100 PREEMPTED")
    a = attempt(db, r.attempt_id)
    assert a["state"] == "failed" and a["stop_kind"] is None
    assert "preempted by Slurm (PREEMPTED)" in member_of(db, r.attempt_id)["reason"]
    assert job(db, r.job_id)["state"] == "failed"


def test_a_node_failure_still_fails_the_attempt(db: Database) -> None:
    r = running(db, max_attempts=1)
    db.call("slurm_member_exited", r.attempt_id, 0, 0, "exited with status 0", True, "NODE_FAIL", None)
    assert attempt(db, r.attempt_id)["state"] == "failed"
    assert "NODE_FAIL" in member_of(db, r.attempt_id)["reason"]


def test_the_grace_ending_stops_the_attempt_and_the_worker_then_cancels_the_slurm_job(db: Database) -> None:
    r = running(db)
    execute(
        db, "UPDATE attempts SET running_at = running_at - interval '100 s' WHERE id = %s", (r.attempt_id,)
    )
    db.call(
        "request_preemption", r.job_id, "preempted by admin root", dt.timedelta(seconds=30), "preempted", None
    )
    assert db.call("slurm_scancel_due", r.fleet_id) == []
    execute(
        db, "UPDATE attempts SET grace_deadline = now() - interval '1 second' WHERE id = %s", (r.attempt_id,)
    )
    assert db.call("expire_grace_deadlines")[0]["expire_grace_deadlines"] == 1
    assert [row["slurm_job_id"] for row in db.call("slurm_scancel_due", r.fleet_id)] == [100]
    db.call("slurm_member_exited", r.attempt_id, 0, -15, "killed by SIGTERM", True, "CANCELLED", None)
    db.call("slurm_job_ended", r.attempt_id, "CANCELLED", "Slurm job 100 CANCELLED")
    a = attempt(db, r.attempt_id)
    assert a["state"] == "preempted" and "stopped at the end of its grace" in a["reason"], a["reason"]
    # Slurm allocates GPUs by count (no indices on its members): the job's 1 GPU × the time since it ran.
    assert a["lost_seconds"] >= 100 and a["lost_gpu_seconds"] == pytest.approx(a["lost_seconds"])


def test_the_signal_of_tuneplanes_own_stop_after_a_member_failed_is_no_preemption(db: Database) -> None:
    fleet_id = slurm_fleet(db, ("s1", "s2"))
    make_job(db, make_user(db), fleet_id, nodes=2, gpus_per_node=1)
    attempt_id = db.call("slurm_submissions_due", fleet_id)[0]["attempt_id"]
    db.call("slurm_submitted", attempt_id, 9)
    db.call("slurm_allocation_started", attempt_id, ["s1", "s2"], 29500, "0" * 64)
    for rank in (0, 1):
        db.call("slurm_member_prepared", attempt_id, rank)
        db.call("slurm_member_started", attempt_id, rank, 100 + rank)
    db.call("slurm_member_exited", attempt_id, 1, 3, "exited with status 3", False, None, None)
    assert attempt(db, attempt_id)["state"] == "stopping"
    assert [r["attempt_id"] for r in db.call("slurm_scancel_due", fleet_id)] == [attempt_id]
    # Rank 0 got the worker's SIGTERM, exited 0, and the Slurm job ended COMPLETED.
    db.call("slurm_member_exited", attempt_id, 0, 0, "exited with status 0", True, "COMPLETED", time.time())
    a = attempt(db, attempt_id)
    assert a["state"] == "failed" and a["stop_kind"] is None, a["reason"]
    assert "member rank 1 failed" in a["reason"]


def time_limit(db: Database, job_id: int, minutes: int) -> None:
    execute(
        db,
        "UPDATE jobs SET spec = jsonb_set(spec, '{resources}', coalesce(spec -> 'resources', '{}') || %s)"
        " WHERE id = %s",
        (Jsonb({"time_limit_minutes": minutes}), job_id),
    )


def test_a_time_limit_asks_a_slurm_job_to_checkpoint_and_slurms_own_limit_leaves_room_for_the_grace(
    db: Database,
) -> None:
    """Before, a Slurm fleet's time limit was Slurm's alone (sbatch --time): at the limit slurmstepd sent
    SIGTERM and, KillWait later, SIGKILL, and the workload was never asked for a checkpoint, so the work since
    the last one was lost. Now TunePlane asks at the limit, as on node fleets (expire_time_limits, kind
    timed_out, the job's signal and grace), and sbatch --time is the limit plus the grace and the stop after
    it, so that Slurm's TIMEOUT only backs the request up."""
    fleet_id = slurm_fleet(db)
    limited = make_job(db, make_user(db), fleet_id, gpus_per_node=1)
    unlimited = make_job(db, db.fetch_one("SELECT id FROM users LIMIT 1")["id"], fleet_id, gpus_per_node=1)
    execute(db, "UPDATE jobs SET spec = spec || %s WHERE id = %s",
            (Jsonb({"preemption": {"signal": "SIGUSR1", "grace_seconds": 90}}), limited))  # fmt: skip
    time_limit(db, limited, 2)
    due = {d["job_id"]: d for d in db.call("slurm_submissions_due", fleet_id)}
    # 2 min + 90 s of grace + the 10 s stop grace + 60 s for the worker's passes = 4 min 40 s → 5 minutes.
    assert due[limited]["time_limit_minutes"] == 5 and due[unlimited]["time_limit_minutes"] is None

    attempt_id = due[limited]["attempt_id"]
    db.call("slurm_submitted", attempt_id, 100)
    db.call("slurm_allocation_started", attempt_id, ["s1"], 29500, "0" * 64)
    db.call("slurm_member_prepared", attempt_id, 0)
    db.call("slurm_member_started", attempt_id, 0, 4242)
    assert db.call("expire_time_limits")[0]["expire_time_limits"] == 0  # within its limit
    execute(
        db, "UPDATE attempts SET running_at = running_at - interval '2 minutes' WHERE id = %s", (attempt_id,)
    )
    assert db.call("expire_time_limits")[0]["expire_time_limits"] == 1
    asked = attempt(db, attempt_id)
    assert asked["stop_kind"] == "timed_out" and "time limit of 2 min" in asked["stop_cause"]
    assert (asked["grace_deadline"] - asked["stop_requested_at"]).total_seconds() == pytest.approx(90)
    request = db.call("slurm_preemptions_due", fleet_id)[0]["request"]
    assert (request["kind"], request["signal"]) == ("timed_out", "SIGUSR1")
    assert db.call("expire_time_limits")[0]["expire_time_limits"] == 0  # asked once


def test_slurms_own_limit_is_never_over_the_partitions_max_time(db: Database) -> None:
    fleet_id = slurm_fleet(db)  # the partition's MaxTime: 60 minutes
    job_id = make_job(db, make_user(db), fleet_id, gpus_per_node=1)
    time_limit(db, job_id, 59)
    assert db.call("slurm_submissions_due", fleet_id)[0]["time_limit_minutes"] == 60
