"""TunePlane's request to checkpoint and stop on a Slurm fleet, end to end on the session's real cluster
(docs/preemption.md, "Slurm fleets"): the worker writes the request file and sends the job's signal to the
steps (`scancel --signal`); a workload that traps it, publishes a checkpoint (registered where it lies on
the shared path) and exits 0 is `preempted`, not `succeeded`; the retry, a new Slurm job, resumes from
that checkpoint. One that ignores the request is stopped at the end of its grace (the Slurm job
cancelled) and resumes from its previous checkpoint."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.test_slurm import Harness
from tuneplane.app.db import Database

# Traps the job's preemption signal itself (SIGUSR1 here: Slurm sends it to every process of the step, so
# the step, the runner and its keeper must live through it), then saves its step, publishes the checkpoint,
# waits until TunePlane verified it and exits 0. A later attempt resumes from $TUNEPLANE_RESUME_DIR.
WORKLOAD = b"""import json, os, signal, sys, time
from pathlib import Path
from tuneplane import sdk

name = os.environ["TUNEPLANE_PREEMPTION_SIGNAL"]
asked = []
signal.signal(getattr(signal, name), lambda *_: asked.append(time.time()))
out = Path(os.environ["TUNEPLANE_OUTPUT_DIR"])
step = 0
resume = sdk.resume_dir()
if resume is not None:
    step = json.loads((resume / "state.json").read_text())["step"]
    print(f"resumed from {os.environ['TUNEPLANE_RESUME_FROM']} at step {step}", flush=True)
print(f"attempt {os.environ['TUNEPLANE_ATTEMPT']} trapping {name}", flush=True)
if os.environ.get("IGNORE") == "1" and resume is None:
    # A workload that saved once and then ignores the request: stopped at the end of its grace.
    step = 1
    saved = out / "checkpoints" / "step-1"
    saved.mkdir(parents=True)
    (saved / "state.json").write_text(json.dumps({"step": step}))
    print(f"published step 1: {sdk.checkpoint(saved, wait=True, timeout=60)['state']}; ignoring", flush=True)
    while True:
        time.sleep(0.05)
last = step + 5 if resume is not None else 10**9
while step < last:
    step += 1
    if asked:
        saved = out / "checkpoints" / f"step-{step}"
        saved.mkdir(parents=True)
        (saved / "state.json").write_text(json.dumps({"step": step}))
        request = sdk.preemption() or {}
        result = sdk.checkpoint(saved, wait=True, timeout=60)
        print(f"{name} at step {step}; request file kind {request.get('kind')}; "
              f"checkpoint {result['artifact']} {result['state']}; exiting 0", flush=True)
        sys.exit(0)
    time.sleep(0.05)
print(f"finished at step {step}", flush=True)
"""


@pytest.fixture
def harness(db: Database, db_url: str, slurm_cluster, tmp_path: Path) -> Iterator[Harness]:
    h = Harness(db, db_url, slurm_cluster, tmp_path, files={"ckpt.py": WORKLOAD})
    h.start()
    yield h
    h.stop()
    slurm_cluster.run("scancel", "--full", "-u", "root", check=False)


def stdout_of(harness: Harness, job_id: int, number: int) -> str:
    attempt = harness.db.fetch_one(
        "SELECT id FROM attempts WHERE job_id = %s AND number = %s", (job_id, number)
    )
    if attempt is None:
        return ""
    path = harness.shared / "attempts" / str(attempt["id"]) / "members" / "0" / "logs" / "stdout.log"
    return path.read_text() if path.is_file() else ""


def preempted_first_attempt(
    harness: Harness, running: str, grace: int, env: dict | None = None
) -> tuple[int, dict]:
    """Submit the workload (SIGUSR1 as its preemption signal, `grace` s), wait until its log says `running`,
    ask it to checkpoint and stop (request_preemption, as an admin or the planner would) and wait until
    attempt 1 ended; the job id and that attempt."""
    job_id = harness.submit(
        nodes=1,
        env=env,
        source={"archive": f"sha256:{harness.sha}", "entrypoint": f"exec {sys.executable} ckpt.py"},
        preemption={"signal": "SIGUSR1", "grace_seconds": grace},
    )
    harness.wait(lambda: running in stdout_of(harness, job_id, 1), running)
    harness.db.call("request_preemption", job_id, "preempted by the test", None, "preempted", None)

    def first_ended() -> bool:
        row = harness.db.fetch_one("SELECT state FROM attempts WHERE job_id = %s AND number = 1", (job_id,))
        return row["state"] not in ("running", "stopping")

    harness.wait(first_ended, "attempt 1 ended", 60)
    return job_id, harness.db.fetch_one("SELECT * FROM attempts WHERE job_id = %s AND number = 1", (job_id,))


def test_a_preempted_job_that_traps_the_signal_and_exits_0_is_preempted_and_its_retry_resumes(
    harness: Harness,
) -> None:
    job_id, first = preempted_first_attempt(harness, "attempt 1 trapping SIGUSR1", 60)
    log = stdout_of(harness, job_id, 1)
    # The workload got the signal and the file, published its checkpoint and exited 0 ...
    assert "SIGUSR1 at step" in log and "request file kind preempted" in log, log
    assert "checkpoint checkpoint.1 complete; exiting 0" in log, log
    member = harness.db.fetch_one("SELECT * FROM members WHERE attempt_id = %s", (first["id"],))
    assert member["state"] == "exited" and member["exit_code"] == 0, member["reason"]
    # ... and the attempt is preempted, not succeeded, naming that checkpoint: nothing lost.
    assert first["state"] == "preempted", first["reason"]
    assert "checkpoint checkpoint.1 verified" in first["reason"] and " GPU-s (" in first["reason"]
    assert first["lost_seconds"] < 5, first["reason"]  # measured: to the member's end as Slurm reported it
    checkpoint = harness.db.fetch_one("SELECT * FROM artifacts WHERE id = %s", (first["end_checkpoint_id"],))
    assert (checkpoint["name"], checkpoint["state"], checkpoint["delivery"]) == (
        "checkpoint.1",
        "complete",
        "shared",
    )
    events = harness.events(job_id)
    assert any("SIGUSR1 sent to the steps of Slurm job" in e for e in events), events
    assert any("queued for attempt 2" in e for e in events), events

    # The retry is a new attempt (a new Slurm job) that starts from exactly that checkpoint.
    job = harness.wait_state(job_id, "succeeded", "failed", "cancelled", timeout=90)
    assert job["state"] == "succeeded", job["state_reason"]
    second = harness.db.fetch_one("SELECT * FROM attempts WHERE job_id = %s AND number = 2", (job_id,))
    assert second["resume_artifact_id"] == checkpoint["id"]
    saved = json.loads((Path(checkpoint["shared_path"]) / "state.json").read_text())["step"]
    log = stdout_of(harness, job_id, 2)
    assert f"resumed from checkpoint.1 at step {saved}" in log, log
    assert f"finished at step {saved + 5}" in log, log
    assert any("resumes from checkpoint.1" in e for e in harness.events(job_id))
    harness.cluster.wait_idle(60)


def test_a_job_ignoring_the_request_is_cancelled_at_the_end_of_its_grace_and_resumes_from_its_checkpoint(
    harness: Harness,
) -> None:
    job_id, first = preempted_first_attempt(
        harness, "published step 1: complete; ignoring", 2, {"IGNORE": "1"}
    )
    assert first["state"] == "preempted", first["reason"]
    assert "stopped at the end of its grace; resumes from checkpoint.1" in first["reason"], first["reason"]
    assert first["lost_gpu_seconds"] > 0
    slurm = harness.db.fetch_one("SELECT * FROM slurm_jobs WHERE attempt_id = %s", (first["id"],))
    assert slurm["preempt_signalled_at"] is not None and slurm["scancel_at"] is not None
    job = harness.wait_state(job_id, "succeeded", "failed", "cancelled", timeout=90)
    assert job["state"] == "succeeded", job["state_reason"]
    log = stdout_of(harness, job_id, 2)
    assert "resumed from checkpoint.1 at step 1" in log and "finished at step 6" in log, log
    harness.cluster.wait_idle(60)


def test_a_slurm_job_past_its_time_limit_is_asked_to_checkpoint_and_ends_timed_out_with_it(
    harness: Harness,
) -> None:
    """Before, a Slurm fleet's time limit was Slurm's TIMEOUT alone: SIGTERM, then SIGKILL, and no checkpoint
    asked for. Now the Slurm worker asks at the limit (expire_time_limits) with the job's signal and grace,
    and Slurm's own limit lies past that grace."""
    job_id = harness.submit(
        nodes=1,
        source={"archive": f"sha256:{harness.sha}", "entrypoint": f"exec {sys.executable} ckpt.py"},
        preemption={"signal": "SIGUSR1", "grace_seconds": 30},
        time_limit_minutes=1,
    )
    harness.wait(lambda: "attempt 1 trapping SIGUSR1" in stdout_of(harness, job_id, 1), "the workload runs")
    attempt_id = harness.db.fetch_one("SELECT id FROM attempts WHERE job_id = %s", (job_id,))["id"]
    # 1 min + 30 s of grace + the 10 s stop grace + 60 s = 2 min 40 s → 3 minutes.
    assert "#SBATCH --time=3\n" in (harness.shared / "attempts" / str(attempt_id) / "batch.sh").read_text()
    # Time passes (test setup): the attempt has run for its minute.
    harness.db.fetch_all(
        "UPDATE attempts SET running_at = running_at - interval '1 minute' WHERE id = %s RETURNING 1",
        (attempt_id,),
    )
    job = harness.wait_state(job_id, "failed", "succeeded", "cancelled", timeout=60)
    first = harness.db.fetch_one("SELECT * FROM attempts WHERE id = %s", (attempt_id,))
    log = stdout_of(harness, job_id, 1)
    assert "SIGUSR1 at step" in log and "request file kind timed_out" in log, log
    assert first["state"] == "timed_out", first["reason"]
    assert "its time limit of 1 min was reached" in first["reason"]
    assert "checkpoint checkpoint.1 verified" in first["reason"], first["reason"]
    assert job["state"] == "failed"  # its one attempt is spent: a time limit counts (docs/preemption.md)
    harness.cluster.wait_idle(60)
