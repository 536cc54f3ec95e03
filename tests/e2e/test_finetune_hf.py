"""examples/finetune-hf end to end: a Hugging Face Trainer fine-tune of a tiny GPT-2 in a `base: node`
environment (the node's torch, transformers and accelerate added by uv), its TensorBoard loss, learning
rate and grad norm under canonical names, its checkpoints delivered as an artifact, and a follow-up job
that fine-tunes further from that artifact. Preempted mid-run (issue 21), the Trainer job resumes from the
`checkpoint-K` it published in its grace and ends after the same optimizer steps as an uninterrupted run."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from tests.e2e.launch_cluster import MIB, Cluster
from tests.helpers import wait_for
from tuneplane.app.blobstore import BlobStore

pytestmark = pytest.mark.e2e

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "finetune-hf"
ENVIRONMENT = {"base": "node", "packages": ["transformers", "accelerate"]}
RESOURCES = {"nodes": 1, "gpus_per_node": 0, "cpus_per_node": 1, "memory_per_node": 512 * MIB}
needs_torch = pytest.mark.skipif(
    importlib.util.find_spec("torch") is None, reason="the node's torch (.ci/run installs it)"
)


def _start(cluster: Cluster, *agent_args: str, store: BlobStore | None = None) -> str:
    """One agent and a worker; the example's train.py uploaded (its archive's digest), into `store` if
    given (an S3 fleet's)."""
    cluster.start_agent("a", *agent_args)
    cluster.start_worker()
    cluster.db.fetch_all("UPDATE launch_settings SET prepare_timeout = interval '300 seconds' RETURNING 1")
    return cluster.upload_source({"train.py": (EXAMPLE / "train.py").read_text()}, store)


def _submit(cluster: Cluster, archive: str, arguments: str, **extra) -> int:
    """The example job (`python train.py ARGUMENTS`) in its environment, on one CPU."""
    return cluster.submit(
        {
            "source": {"archive": archive, "entrypoint": f"python train.py {arguments}"},
            "environment": ENVIRONMENT,
            "resources": RESOURCES,
            "env": {"OMP_NUM_THREADS": "1"},
            **extra,
        }
    )


def _canonical_names(cluster: Cluster, job_id: int) -> set[str]:
    rows = cluster.db.fetch_all(
        "SELECT DISTINCT canonical FROM telemetry_series WHERE job_id = %s AND canonical IS NOT NULL",
        (job_id,),
    )
    return {r["canonical"] for r in rows}


@needs_torch
def test_hf_trainer_fine_tune_and_a_follow_up_from_its_checkpoint(cluster: Cluster) -> None:
    archive = _start(cluster, "--telemetry-url", cluster.start_telemetry_gateway())
    first = _submit(
        cluster,
        archive,
        "--steps 12 --save-steps 6",
        outputs=[{"name": "checkpoints", "path": "checkpoints"}],
    )
    job = cluster.wait_job(first, ("succeeded", "failed", "cancelled"), timeout=240)
    assert job["state"] == "succeeded", cluster.diagnose(first)
    env = job["spec"]["runtime"]["environment"]
    assert "transformers" in env["packages"] and not any(
        n.startswith(("torch", "nvidia")) for n in env["packages"]
    )

    canonical = wait_for(
        lambda: (
            (found := _canonical_names(cluster, first)) >= {"loss", "learning_rate", "grad_norm"} and found
        ),
        timeout=60,
        what="loss, learning rate and grad norm under canonical names",
    )
    assert {"loss", "learning_rate", "grad_norm"} <= canonical
    artifact = wait_for(
        lambda: cluster.db.fetch_one(
            "SELECT * FROM artifacts WHERE job_id = %s AND name = 'checkpoints' AND state = 'complete'",
            (first,),
        ),
        timeout=120,
        what="the checkpoints artifact complete",
    )
    assert artifact["manifest_digest"]

    follow = _submit(
        cluster,
        archive,
        "--steps 4 --save-steps 4 --init-from base",
        inputs=[{"name": "base", "artifact": f"{first}/checkpoints"}],
    )
    job = cluster.wait_job(follow, ("succeeded", "failed", "cancelled"), timeout=180)
    assert job["state"] == "succeeded", cluster.diagnose(follow)
    (member,) = cluster.members(follow)
    stdout = (cluster.member_dir("a", member["id"]) / "logs" / "stdout.log").read_text()
    assert "fine-tuning further from" in stdout and "checkpoint-12" in stdout, stdout[-2000:]
    reasons = [
        r["reason"]
        for r in cluster.db.fetch_all(
            "SELECT reason FROM job_events WHERE job_id = %s AND detail ->> 'kind' = 'prepare'", (follow,)
        )
    ]
    assert any("reused" in r for r in reasons), reasons  # the same lock: the first job's environment


STEPS, SAVE_STEPS = 20, 4


@needs_torch
def test_hf_trainer_preempted_mid_run_resumes_from_checkpoint_k_and_ends_after_the_same_steps(
    cluster: Cluster,
) -> None:
    """Acceptance (issue 21): the Trainer job, preempted mid-run, resumes from `checkpoint-K` and finishes
    with the same number of optimizer steps as an uninterrupted run. Trainer's own state says it: the
    final checkpoint's trainer_state.json has global_step STEPS and one loss per step 1..STEPS (steps 1..K
    from the first attempt, restored with checkpoint-K; K+1..STEPS from the retry)."""
    archive = _start(cluster)
    # Half a second per step: the request lands mid-run (STEPS is 10 s of waiting, most of it after K).
    job_id = _submit(cluster, archive, f"--steps {STEPS} --save-steps {SAVE_STEPS} --step-seconds 0.5")
    # The environment is built (or found) before the first step: a longer wait for the first checkpoint.
    first = cluster.preempt_after_a_checkpoint(job_id, "e2e: mid-run", checkpoint_timeout=240, timeout=120)
    k = first["end_checkpoint_step"]  # the step train.py gave sdk.checkpoint: Trainer's checkpoint-K
    assert k is not None and SAVE_STEPS <= k < STEPS, first
    assert f"checkpoint {first['end_checkpoint']} (step {k}) verified" in first["reason"], first["reason"]
    (victim,) = cluster.members_of_attempt(job_id, 1)
    assert f"stopped at step {k}: asked to checkpoint and stop" in cluster.member_log(victim)

    done = cluster.wait_job(job_id, ("succeeded", "failed", "cancelled"), timeout=240)
    assert done["state"] == "succeeded", cluster.explain(job_id)
    (member,) = cluster.members_of_attempt(job_id, 2)
    stdout = cluster.member_log(member)
    assert f"resuming from {first['end_checkpoint']}: checkpoint-{k} " in stdout, stdout[-2000:]
    assert f"done: {STEPS} steps" in stdout, stdout[-2000:]
    output = cluster.member_dir(member["node"], member["id"]) / "output"
    state = json.loads((output / "checkpoints" / f"checkpoint-{STEPS}" / "trainer_state.json").read_text())
    assert state["global_step"] == state["max_steps"] == STEPS  # an uninterrupted run's count
    assert [e["step"] for e in state["log_history"] if "loss" in e] == list(range(1, STEPS + 1))
