"""Idle GPUs end to end: a real agent runs the job, the real worker's sweep judges it from simulated GPUs
(NVML-shaped samples the test writes through the real telemetry gateway, tests/simulated_gpus.py: there is
no GPU here and the policy reads only stored samples), warns, and at the end of the idle grace reclaims it
through the preemption protocol: the workload is asked to checkpoint and stop (PREEMPT: sdk.preempting(),
SIGTERM), publishes a checkpoint and exits; the attempt ends `preempted (idle)` naming it, and the job
ends (it was not submitted with resume_when_idle_reclaimed). A real HTTP receiver gets the warning and
the reclaim once each, the first retried after it answered 500."""

from __future__ import annotations

import sys
import time
from datetime import timedelta

import pytest

from tests.e2e.launch_cluster import MIB, Cluster
from tests.helpers import wait_for
from tests.simulated_gpus import IDLE, post_samples
from tests.submission_setup import add_user
from tests.telemetry_support import member_token
from tests.webhook_receiver import Receiver

pytestmark = pytest.mark.e2e

SECRET = "e2e-idle-webhook-secret-01"


@pytest.fixture(autouse=True)
def loopback_allowed(monkeypatch: pytest.MonkeyPatch) -> None:
    """The receiver is on loopback: the webhook target policy is opened for it (app/webhook_targets.py)."""
    monkeypatch.setenv("TUNEPLANE_WEBHOOK_ALLOW", "127.0.0.1")


# Holds its GPUs doing nothing until asked to checkpoint and stop (sdk.preempting(), which also traps the
# SIGTERM that comes with the request), then publishes a checkpoint, waits for its verification and exits.
# Started as `exec <this interpreter> idle.py`: a `python` found on PATH may be a wrapper script (pyenv's
# shim here) that the preemption signal would end before the workload could checkpoint.
HOLDER = """
import json, os, pathlib, time
from tuneplane import sdk
sdk.trap_preemption_signal()
print("holding", flush=True)
while not sdk.preempting():
    time.sleep(0.2)
ckpt = pathlib.Path(os.environ["TUNEPLANE_OUTPUT_DIR"]) / "ckpt"
ckpt.mkdir()
(ckpt / "state.json").write_text(json.dumps({"step": 1}))
result = sdk.checkpoint(ckpt, name="ckpt", wait=True)
print("asked to stop:", sdk.preemption()["reason"], result["artifact"], result["state"], flush=True)
"""


def test_idle_job_is_warned_then_reclaimed_and_the_team_webhook_hears_both_once(cluster: Cluster) -> None:
    receiver = Receiver([500])  # the first delivery fails: it must come again
    try:
        db = cluster.db
        db.fetch_all(
            "UPDATE webhook_settings SET backoff_base = %s RETURNING 1", (timedelta(milliseconds=200),)
        )
        db.fetch_all("UPDATE idle_settings SET check_every = interval '1 second' RETURNING 1")
        admin = add_user(db, "root", "admin")
        db.call(
            "set_idle_policy", admin, cluster.fleet, None, None, None, None, "reclaim", timedelta(seconds=3)
        )
        db.call("create_team_webhook", cluster.user_id, "alice", receiver.url, SECRET,
                ["job.idle_warning", "job.idle_reclaimed"])  # fmt: skip
        telemetry = cluster.start_telemetry_gateway()
        cluster.start_agent("a", "--simulate-gpus", "2")
        cluster.start_worker()
        archive = cluster.upload_source({"idle.py": HOLDER})
        job_id = cluster.submit(
            {
                "source": {
                    "archive": archive,
                    "entrypoint": f"exec {sys.executable} idle.py",
                    "integration": "script",
                },
                "resources": {
                    "nodes": 1,
                    "gpus_per_node": 2,
                    "cpus_per_node": 1,
                    "memory_per_node": 64 * MIB,
                },
            }
        )
        (member,) = cluster.wait_members(job_id, "running", timeout=90)
        # Its two GPUs idle for the last 31 minutes and the next 3, as its collector would have sent them.
        wait_for(lambda: _gateway_up(telemetry), timeout=30, what="the telemetry gateway")
        now = time.time()
        readings = {gpu: IDLE for gpu in member["gpu_indices"]}
        post_samples(telemetry, member_token(db, job_id, 1, 0), readings, now - 31 * 60, now + 180)

        warned = wait_for(
            lambda: db.fetch_one(
                "SELECT * FROM job_idle WHERE job_id = %s AND warned_at IS NOT NULL", (job_id,)
            ),
            timeout=60,
            what="the idle warning",
        )
        assert warned["warning"].startswith(
            "GPUs idle for 30 min (utilization < 5 %, power < 20 % on all 2 GPUs)"
        )
        reclaimed = wait_for(
            lambda: db.fetch_one(
                "SELECT * FROM job_idle WHERE job_id = %s AND reclaimed_at IS NOT NULL", (job_id,)
            ),
            timeout=60,
            what="the reclaim at the end of the grace",
        )
        assert reclaimed["reclaimed_at"] >= warned["deadline"]
        job = cluster.wait_job(job_id, ("succeeded", "failed", "cancelled", "queued"), timeout=90)
        assert job["state"] == "cancelled", cluster.diagnose(job_id)
        attempt = db.fetch_one(
            "SELECT state, stop_kind, end_checkpoint_id FROM attempts WHERE job_id = %s", (job_id,)
        )
        assert (attempt["state"], attempt["stop_kind"]) == ("preempted", "preempted")
        assert job["state_reason"].startswith("attempt 1 preempted (idle): GPUs idle for 30 min"), job
        # It published a checkpoint within the grace: the reason names it, and nothing was lost.
        assert attempt["end_checkpoint_id"] is not None, cluster.diagnose(job_id)
        assert "checkpoint ckpt.1 verified" in job["state_reason"], job["state_reason"]
        assert "GPU-s (0." in job["state_reason"] and "not resumed" in job["state_reason"]  # under 1 s
        reasons = [
            e["reason"] for e in db.fetch_all("SELECT reason FROM job_events WHERE job_id = %s", (job_id,))
        ]
        assert any(r.startswith("attempt 1 asked to checkpoint and stop: GPUs idle for") for r in reasons), (
            reasons
        )

        def both_delivered() -> dict | None:
            kinds = {g["body"]["kind"]: g["body"]["id"] for g in receiver.got}
            return kinds if set(kinds) == {"job.idle_warning", "job.idle_reclaimed"} else None

        kinds = wait_for(both_delivered, timeout=30, what="the warning and the reclaim at the receiver")
        ids = [g["body"]["id"] for g in receiver.got]
        # Once each: the warning (answered 500 first) came twice with one event id, the reclaim once.
        assert sorted(ids) == sorted([kinds["job.idle_warning"]] * 2 + [kinds["job.idle_reclaimed"]])
        warning = next(g["body"] for g in receiver.got if g["body"]["kind"] == "job.idle_warning")
        assert warning["job"]["id"] == job_id and warning["data"]["deadline"]
    finally:
        receiver.close()


def _gateway_up(url: str) -> bool:
    import httpx

    try:
        return httpx.get(f"{url}/healthz", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False
