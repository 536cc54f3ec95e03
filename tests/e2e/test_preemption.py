"""The checkpoint grace protocol end to end with real agents (issue 21): a running fine-tune is asked to
checkpoint and stop (request_preemption, what the planner, `tuneplane jobs preempt` and time limits call).

* An urgent job arrives in a full fleet: the planner preempts the demo fine-tune, the urgent job runs on
  the GPU held for it, and the fine-tune resumes afterwards from the checkpoint of its grace.

* A cooperative victim (the demo recipe, which polls sdk.preempting()) publishes a verified checkpoint
  within its grace and stops: the attempt ends `preempted` naming it, nothing lost, and the next attempt
  resumes from exactly that step and ends after exactly the job's steps, no step stored twice.
* A victim that ignores the request (SIGTERM ignored, no SDK check) is stopped at the deadline: the
  attempt ends `preempted` naming its previous verified checkpoint, the lost GPU-seconds are GPUs × the
  time since that checkpoint was verified, and the retry resumes from it.
* A job past its time limit gets the same request and ends `timed_out` with its checkpoint named.
"""

from __future__ import annotations

import datetime as dt
import json

import pytest

from tests.e2e.launch_cluster import MIB, Cluster
from tests.helpers import wait_for
from tests.submission_setup import add_user

pytestmark = pytest.mark.e2e

STEPS, EVERY = 400, 50

# A workload that ignores every request: SIGTERM ignored, no look at sdk.preempting(). It saves and
# publishes (waiting for the verification) a checkpoint every EVERY steps and resumes from one.
STUBBORN = """
import json, os, pathlib, signal, sys, time
from tuneplane import sdk
signal.signal(signal.SIGTERM, signal.SIG_IGN)
out = pathlib.Path(os.environ["TUNEPLANE_OUTPUT_DIR"])
steps, every = int(os.environ["STEPS"]), int(os.environ["EVERY"])
first = 1
if sdk.resume_dir() is not None:
    first = json.loads((sdk.resume_dir() / "state.json").read_text())["step"] + 1
    print(f"resumed from {os.environ['TUNEPLANE_RESUME_FROM']} at step {first - 1}", flush=True)
with open(out / "metrics.jsonl", "a") as metrics:
    for step in range(first, steps + 1):
        metrics.write(json.dumps({"step": step, "loss": 1.0 / step}) + "\\n"); metrics.flush()
        if step % every == 0:
            d = out / "ckpt" / f"step-{step:06d}"
            d.mkdir(parents=True)
            (d / "state.json").write_text(json.dumps({"step": step}))
            result = sdk.checkpoint(d, name="ckpt", step=step, wait=True)
            print(f"step {step}: {result['artifact']} {result['state']}", flush=True)
        time.sleep(float(os.environ.get("STEP_SECONDS", "0.05")))
print(f"done: {steps} steps", flush=True)
"""


# Issue 35: a plain training loop that knows nothing of the SDK's preemption check: it saves when SIGTERM
# comes, and its save takes SAVE_SECONDS (longer than the runner's old 5 s cleanup of what a killed shell
# left); it exits 0. Started as `python train.py`, without exec, so through Debian's dash as /bin/sh.
PLAIN = """
import json, os, pathlib, signal, sys, time
from tuneplane import sdk
asked, saved_at = [], []
signal.signal(signal.SIGTERM, lambda *_: asked.append(1))
out = pathlib.Path(os.environ["TUNEPLANE_OUTPUT_DIR"])
steps, every = int(os.environ["STEPS"]), int(os.environ["EVERY"])

def save(step):
    d = out / "ckpt" / f"step-{step:06d}"
    d.mkdir(parents=True)
    (d / "state.json").write_text(json.dumps({"step": step}))
    result = sdk.checkpoint(d, name="ckpt", step=step, wait=True)
    print(f"step {step}: {result['artifact']} {result['state']}", flush=True)

first = 1
if sdk.resume_dir() is not None:
    first = json.loads((sdk.resume_dir() / "state.json").read_text())["step"] + 1
    print(f"resumed from {os.environ['TUNEPLANE_RESUME_FROM']} at step {first - 1}", flush=True)
with open(out / "metrics.jsonl", "a") as metrics:
    for step in range(first, steps + 1):
        if saved_at and time.time() - saved_at[0] >= float(os.environ.get("RUN_ON", "0")):
            sys.exit(0)  # RUN_ON: it trained on that long after its checkpoint
        metrics.write(json.dumps({"step": step, "loss": 1.0 / step}) + "\\n"); metrics.flush()
        if asked and not saved_at:
            time.sleep(float(os.environ["SAVE_SECONDS"]))  # a slow save
            save(step)
            saved_at.append(time.time())
        elif not saved_at and step % every == 0:
            save(step)
        time.sleep(0.05)
print(f"done: {steps} steps", flush=True)
"""


def _script_job(cluster: Cluster, name: str, source: str, gpus: int, env: dict, grace: float) -> int:
    """A job running `python NAME` (no exec: through dash) from `source`, on a node with `gpus` simulated
    GPUs (none: CPU-only), once its member runs."""
    cluster.start_agent("a", *(("--simulate-gpus", str(gpus)) if gpus else ()))
    cluster.start_worker()
    archive = cluster.upload_source({name: source})
    resources = {"cpus_per_node": 1, "memory_per_node": 64 * MIB, **({"gpus_per_node": gpus} if gpus else {})}
    job_id = cluster.submit(
        {
            "source": {"archive": archive, "entrypoint": f"python {name}", "integration": "script"},
            "resources": resources,
            "env": env,
            "preemption": {"grace_seconds": grace},
        }
    )
    cluster.wait_members(job_id, "running", timeout=60)
    return job_id


def _steps(cluster: Cluster, member: dict) -> list[int]:
    path = cluster.member_dir(member["node"], member["id"]) / "output" / "metrics.jsonl"
    return [json.loads(line)["step"] for line in path.read_text().splitlines()]


def _fine_tune(cluster: Cluster, **extra) -> int:
    """The demo fine-tune of these tests (STEPS steps, a checkpoint every EVERY), running with a first
    verified checkpoint."""
    job_id = cluster.submit(
        {
            "recipe": {
                "name": "demo",
                "params": {"steps": STEPS, "step_seconds": 0.05, "checkpoint_every": EVERY},
            },
            "resources": {
                "gpus_per_node": 1,
                "cpus_per_node": 1,
                "memory_per_node": 256 * MIB,
                **extra.pop("resources", {}),
            },
            **extra,
        }
    )
    cluster.wait_members(job_id, "running", timeout=60)
    wait_for(
        lambda: cluster.checkpoints(job_id),
        timeout=60,
        what="a first verified checkpoint",
        explain=lambda: cluster.explain(job_id),
    )
    return job_id


def test_a_cooperative_victim_checkpoints_within_its_grace_and_resumes_from_it(cluster: Cluster) -> None:
    cluster.start_agent("a", "--simulate-gpus", "2")
    cluster.start_worker()
    job_id = _fine_tune(cluster, preemption={"grace_seconds": 60})
    cluster.db.call("request_preemption", job_id, "e2e: an urgent job needs the GPU", None, "preempted", None)
    first = wait_for(
        lambda: (a := cluster.attempt(job_id, 1)) and a["state"] == "preempted" and a,
        timeout=60,
        what="attempt 1 preempted",
    )
    assert first["lost_seconds"] < 2, first["reason"]  # measured: the moment it took to exit
    assert first["end_checkpoint_at"] >= first["stop_requested_at"]  # verified within the grace
    assert first["end_checkpoint_at"] <= first["grace_deadline"]
    # The words name the checkpoint with the step the demo recipe gave sdk.checkpoint (issue 21, point 6).
    member, resumed = cluster.resumed_after_preemption(job_id, first)
    member_dir = cluster.member_dir(member["node"], member["id"])
    (victim,) = cluster.members_of_attempt(job_id, 1)
    assert _steps(cluster, victim)[-1] == resumed  # it stopped at the step it saved
    assert resumed % EVERY != 0 or resumed > 0
    stdout = (member_dir / "logs" / "stdout.log").read_text()
    assert f"resumed from {first['end_checkpoint']} at step {resumed}" in stdout
    assert _steps(cluster, member) == list(range(resumed + 1, STEPS + 1))  # exact, no step twice


def test_a_plain_script_without_exec_gets_its_whole_grace_to_save_and_exits_0(cluster: Cluster) -> None:
    """Issue 35, acceptance 1: dash runs `python train.py` as its child; the SIGTERM ends the shell at once,
    but the program saves for longer than 5 s inside its grace, exits 0, and nothing is re-done."""
    env = {"STEPS": "300", "EVERY": "50", "SAVE_SECONDS": "7"}
    job_id = _script_job(cluster, "train.py", PLAIN, gpus=1, env=env, grace=30)
    first = cluster.preempt_after_a_checkpoint(job_id, "e2e: a plain script", timeout=60)
    assert first["lost_seconds"] < 2, first["reason"]  # measured: the moment it took to exit
    assert first["stop_requested_at"] <= first["end_checkpoint_at"] <= first["grace_deadline"], first
    (victim,) = cluster.members_of_attempt(job_id, 1)
    assert victim["exit_code"] == 0, victim  # the program's own status, not the killed shell's
    saved = first["end_checkpoint_step"]
    assert _steps(cluster, victim)[-1] == saved
    done = cluster.wait_job(job_id, ("succeeded", "failed"), timeout=120)
    assert done["state"] == "succeeded", cluster.diagnose(job_id)
    assert cluster.attempt(job_id, 2)["resume_artifact_id"] == first["end_checkpoint_id"]
    (member,) = cluster.members_of_attempt(job_id, 2)
    assert _steps(cluster, member) == list(range(saved + 1, 301))  # 0 steps re-done
    # Checkpoint names go on numbering across attempts: one name, one artifact of the job (issue 35).
    rows = cluster.db.fetch_all(
        "SELECT name FROM artifacts WHERE job_id = %s AND kind = 'checkpoint' ORDER BY id", (job_id,)
    )
    names = [r["name"] for r in rows]  # retention may prune some, never rename one
    assert names == [f"ckpt.{n}" for n in range(1, len(names) + 1)], names
    assert names.index(first["end_checkpoint"]) < len(names) - 1, names  # attempt 2 numbered on


def test_a_workload_that_runs_on_after_its_checkpoint_in_the_grace_loses_the_work_after_it(
    cluster: Cluster,
) -> None:
    """Issue 35, acceptance 3: a checkpoint completed inside the grace, but the workload trained on for
    RUN_ON seconds before it exited: the recorded lost work is those seconds (was: 0), and the next attempt
    re-does exactly the steps after the checkpoint. A CPU-only job: said in seconds and CPU-seconds."""
    env = {"STEPS": "300", "EVERY": "50", "SAVE_SECONDS": "0", "RUN_ON": "4"}
    job_id = _script_job(cluster, "train.py", PLAIN, gpus=0, env=env, grace=30)
    first = cluster.preempt_after_a_checkpoint(job_id, "e2e: runs on", timeout=60)
    (victim,) = cluster.members_of_attempt(job_id, 1)
    saved = first["end_checkpoint_step"]
    assert first["stop_requested_at"] <= first["end_checkpoint_at"], first
    after = (victim["ended_at"] - first["end_checkpoint_at"]).total_seconds()
    assert first["lost_seconds"] == pytest.approx(after, abs=0.01)
    assert 4 <= first["lost_seconds"] < 4 + 2.0, first["reason"]  # RUN_ON, within a report's delay
    assert first["lost_gpu_seconds"] == 0
    assert f"lost {first['lost_seconds']:.1f} s (" in first["reason"] and "CPU-s) since" in first["reason"]
    re_done = [s for s in _steps(cluster, victim) if s > saved]
    assert re_done, "it trained on after its checkpoint"
    done = cluster.wait_job(job_id, ("succeeded", "failed"), timeout=120)
    assert done["state"] == "succeeded", cluster.diagnose(job_id)
    (member,) = cluster.members_of_attempt(job_id, 2)
    assert _steps(cluster, member)[: len(re_done)] == re_done  # exactly those steps are done again


def test_a_victim_that_ignores_the_request_is_stopped_at_the_deadline_and_loses_the_work_since(
    cluster: Cluster,
) -> None:
    # A checkpoint every 15 s: none can come between the request and the kill (8 s + 3 s). The grace is
    # longer than the runner's old 5 s cleanup of what the killed shell (`python job.py` without exec runs
    # below dash) left: the program is stopped at the deadline, not before.
    env = {"STEPS": "600", "EVERY": "300", "STEP_SECONDS": "0.05"}
    job_id = _script_job(cluster, "job.py", STUBBORN, gpus=2, env=env, grace=8)
    first = cluster.preempt_after_a_checkpoint(job_id, "e2e: ignored")
    assert "stopped at the end of its grace" in first["reason"], first["reason"]
    assert f"resumes from {first['end_checkpoint']} (step {first['end_checkpoint_step']})" in first["reason"]
    assert first["end_checkpoint_at"] < first["stop_requested_at"], first  # the one before the request
    newest_before = [c for c in cluster.checkpoints(job_id) if c["completed_at"] <= first["ended_at"]][-1]
    assert first["end_checkpoint_id"] == newest_before["id"]
    # GPUs × the time since that checkpoint was verified, within one report interval.
    since = (first["ended_at"] - first["end_checkpoint_at"]).total_seconds()
    assert first["lost_gpu_seconds"] == pytest.approx(2 * since, abs=2 * 1.0)
    assert first["ended_at"] >= first["grace_deadline"]
    (victim,) = cluster.members_of_attempt(job_id, 1)
    assert victim["ended_at"] >= first["grace_deadline"], victim  # not killed before it (issue 35)
    # ... but at it: the STOP at the deadline, SIGKILL after launch_settings.stop_grace (3 s here), reported
    # within a report interval or so.
    assert (victim["ended_at"] - first["grace_deadline"]).total_seconds() < 3 + 3, victim
    done = cluster.wait_job(job_id, ("succeeded", "failed"), timeout=120)
    assert done["state"] == "succeeded", cluster.diagnose(job_id)
    (member,) = cluster.members_of_attempt(job_id, 2)
    stdout = cluster.member_log(member)
    assert f"resumed from {first['end_checkpoint']}" in stdout
    resumed = int(stdout.split(" at step ")[1].split()[0])
    assert _steps(cluster, member) == list(range(resumed + 1, 601))


def test_a_job_past_its_time_limit_ends_timed_out_with_its_checkpoint_named(cluster: Cluster) -> None:
    cluster.start_agent("a", "--simulate-gpus", "2")
    cluster.start_worker()
    job_id = _fine_tune(cluster, resources={"time_limit_minutes": 1}, max_attempts=2)
    # Time passes (test setup): the attempt has run for its minute.
    cluster.db.fetch_all(
        "UPDATE attempts SET running_at = running_at - %s WHERE job_id = %s RETURNING 1",
        (dt.timedelta(minutes=1), job_id),
    )
    first = wait_for(
        lambda: (a := cluster.attempt(job_id, 1)) and a["state"] == "timed_out" and a,
        timeout=60,
        what="attempt 1 timed out",
    )
    assert "its time limit of 1 min was reached" in first["reason"]
    assert (
        f"checkpoint {first['end_checkpoint']} (step {first['end_checkpoint_step']}) verified"
        in first["reason"]
    )
    done = cluster.wait_job(job_id, ("succeeded", "failed"), timeout=120)
    assert done["state"] == "succeeded", cluster.diagnose(job_id)
    assert cluster.attempt(job_id, 2)["resume_artifact_id"] == first["end_checkpoint_id"]


def test_an_urgent_job_preempts_a_running_fine_tune_which_resumes_after_it(cluster: Cluster) -> None:
    """Acceptance 1: the demo fine-tune fills the fleet, an urgent job arrives; the planner asks the victim
    to checkpoint and stop, the urgent job starts on the GPU held for it, and when it ends the victim
    resumes from the checkpoint it published in its grace: exact step count, no step twice, nothing lost."""
    cluster.db.fetch_all("UPDATE preemption_settings SET min_runtime = interval '0' RETURNING 1")
    cluster.start_agent("a", "--simulate-gpus", "1")
    cluster.start_worker()
    victim = _fine_tune(cluster, priority="normal")
    # Priority is granted (issue 38): an installation admin lets team alice use `urgent`.
    root = add_user(cluster.db, "root", "admin")
    cluster.db.call("set_team_priority_grant", root, "alice", None, "urgent")
    urgent = cluster.submit(
        {
            "recipe": {"name": "demo", "params": {"steps": 20, "step_seconds": 0.05}},
            "resources": {"gpus_per_node": 1, "cpus_per_node": 1, "memory_per_node": 256 * MIB},
            "priority": "urgent",
        }
    )
    first = wait_for(
        lambda: (a := cluster.attempt(victim, 1)) and a["state"] == "preempted" and a,
        timeout=90,
        what="the victim preempted",
    )
    assert first["preempted_by_job_id"] == urgent
    assert first["lost_seconds"] < 2, first["reason"]  # measured: the moment it took to exit
    assert f"preempted by job {urgent} (team alice, priority urgent (100))" in first["reason"], first[
        "reason"
    ]
    decision = cluster.db.fetch_one("SELECT * FROM preemptions WHERE preemptor_job_id = %s", (urgent,))
    assert decision["rule"] == "priority"
    done = cluster.wait_job(urgent, ("succeeded", "failed"), timeout=90)
    assert done["state"] == "succeeded", cluster.diagnose(urgent)
    assert (
        cluster.db.fetch_one("SELECT state FROM preemptions WHERE id = %s", (decision["id"],))["state"]
        == "done"
    )
    done = cluster.wait_job(victim, ("succeeded", "failed"), timeout=120)
    assert done["state"] == "succeeded", cluster.diagnose(victim)
    second = cluster.attempt(victim, 2)
    assert second["resume_artifact_id"] == first["end_checkpoint_id"]
    # One GPU: the victim was placed again only once the urgent job had let go of it.
    urgent_end = cluster.db.fetch_one("SELECT ended_at FROM attempts WHERE job_id = %s", (urgent,))[
        "ended_at"
    ]
    assert second["created_at"] >= urgent_end
    (member,) = cluster.members_of_attempt(victim, 2)
    member_dir = cluster.member_dir(member["node"], member["id"])
    resumed = json.loads((member_dir / "resume" / "state.json").read_text())["step"]
    stdout = (member_dir / "logs" / "stdout.log").read_text()
    assert f"resumed from {first['end_checkpoint']} at step {resumed}" in stdout
    assert _steps(cluster, member) == list(range(resumed + 1, STEPS + 1))
