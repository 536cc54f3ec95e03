"""examples/finetune-hf end to end: a Hugging Face Trainer fine-tune of a tiny GPT-2 in a `base: node`
environment (the node's torch, transformers and accelerate added by uv), its TensorBoard loss, learning
rate and grad norm under canonical names, its checkpoints delivered as an artifact, and a follow-up job
that fine-tunes further from that artifact."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from tests.e2e.launch_cluster import MIB, Cluster
from tests.helpers import wait_for

pytestmark = pytest.mark.e2e

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "finetune-hf"
ENVIRONMENT = {"base": "node", "packages": ["transformers", "accelerate"]}
RESOURCES = {"nodes": 1, "gpus_per_node": 0, "cpus_per_node": 1, "memory_per_node": 512 * MIB}


def _canonical_names(cluster: Cluster, job_id: int) -> set[str]:
    rows = cluster.db.fetch_all(
        "SELECT DISTINCT canonical FROM telemetry_series WHERE job_id = %s AND canonical IS NOT NULL",
        (job_id,),
    )
    return {r["canonical"] for r in rows}


@pytest.mark.skipif(
    importlib.util.find_spec("torch") is None, reason="the node's torch (.ci/run installs it)"
)
def test_hf_trainer_fine_tune_and_a_follow_up_from_its_checkpoint(cluster: Cluster) -> None:
    telemetry = cluster.start_telemetry_gateway()
    cluster.start_agent("a", "--telemetry-url", telemetry)
    cluster.start_worker()
    cluster.db.fetch_all("UPDATE launch_settings SET prepare_timeout = interval '300 seconds' RETURNING 1")
    archive = cluster.upload_source({"train.py": (EXAMPLE / "train.py").read_text()})
    first = cluster.submit(
        {
            "source": {"archive": archive, "entrypoint": "python train.py --steps 12 --save-steps 6"},
            "environment": ENVIRONMENT,
            "resources": RESOURCES,
            "env": {"OMP_NUM_THREADS": "1"},
            "outputs": [{"name": "checkpoints", "path": "checkpoints"}],
        }
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

    follow = cluster.submit(
        {
            "source": {
                "archive": archive,
                "entrypoint": "python train.py --steps 4 --save-steps 4 --init-from base",
            },
            "environment": ENVIRONMENT,
            "resources": RESOURCES,
            "env": {"OMP_NUM_THREADS": "1"},
            "inputs": [{"name": "base", "artifact": f"{first}/checkpoints"}],
        }
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
