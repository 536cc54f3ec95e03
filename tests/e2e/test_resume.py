"""Resume from the last verified checkpoint, end to end with real agents (issue 21, acceptance 3): a demo
fine-tune publishing a checkpoint every few steps loses its node — fenced while connected, or its agent
`kill -9`'d and never restarted, then fenced by the operator — and the retry on the other node starts
from the job's newest verified checkpoint: its log shows the resumed step, its metrics continue from
there (no step stored twice within the attempt) and it ends after exactly the job's number of steps."""

from __future__ import annotations

import json

import pytest

from tests.e2e.launch_cluster import MIB, Cluster
from tests.helpers import wait_for

pytestmark = pytest.mark.e2e

STEPS, EVERY = 300, 20


def _spec() -> dict:
    return {
        "recipe": {
            "name": "demo",
            "params": {"steps": STEPS, "step_seconds": 0.05, "checkpoint_every": EVERY, "log_every": 1},
        },
        "resources": {"cpus_per_node": 1, "memory_per_node": 256 * MIB},
        "max_attempts": 2,
    }


def _complete_checkpoints(cluster: Cluster, job_id: int) -> list[dict]:
    return cluster.db.fetch_all(
        "SELECT id, name FROM artifacts WHERE job_id = %s AND kind = 'checkpoint' AND state = 'complete'"
        " ORDER BY completed_at, id",
        (job_id,),
    )


@pytest.mark.parametrize("loss", ["fenced", "agent-killed"])
def test_the_retry_on_another_node_resumes_from_the_last_verified_checkpoint(
    cluster: Cluster, loss: str
) -> None:
    cluster.start_agent("a")
    cluster.start_worker()
    job_id = cluster.submit(_spec())
    (first,) = cluster.wait_members(job_id, "running", timeout=60)
    wait_for(
        lambda: len(_complete_checkpoints(cluster, job_id)) >= 2, timeout=60, what="two verified checkpoints"
    )
    cluster.start_agent("b")  # the node the retry will find
    if loss == "agent-killed":
        cluster.kill9(cluster.agents["a"])
        cluster.wait_contact_lost(job_id)
    cluster.db.call("fence_node", "gpu/a", f"e2e: node lost ({loss})", "user:test")
    done = cluster.wait_job(job_id, ("succeeded", "failed"), timeout=120)
    assert done["state"] == "succeeded", cluster.diagnose(job_id)

    attempt = cluster.db.fetch_one(
        """SELECT t.*, a.name AS resume_name FROM attempts t JOIN artifacts a ON a.id = t.resume_artifact_id
            WHERE t.job_id = %s AND t.number = 2""",
        (job_id,),
    )
    assert attempt is not None, cluster.diagnose(job_id)
    # Every checkpoint the first attempt got verified before the retry prepared: the retry took the newest.
    verified_before = cluster.db.fetch_all(
        """SELECT a.name FROM artifacts a WHERE a.job_id = %s AND a.kind = 'checkpoint' AND a.attempt_id = %s
              AND a.completed_at <= (SELECT e.at FROM job_events e WHERE e.job_id = %s
                                      AND e.reason LIKE 'attempt 2: preparing%%' ORDER BY e.id LIMIT 1)
            ORDER BY a.completed_at DESC, a.id DESC LIMIT 1""",
        (job_id, first["attempt_id"], job_id),
    )
    assert [r["name"] for r in verified_before] == [attempt["resume_name"]]
    retry = next(m for m in cluster.members(job_id) if m["attempt_id"] == attempt["id"])
    assert retry["node"] == "b"
    member_dir = cluster.member_dir("b", retry["id"])
    resumed = json.loads((member_dir / "resume" / "state.json").read_text())["step"]
    assert resumed % EVERY == 0 and resumed >= 2 * EVERY
    stdout = (member_dir / "logs" / "stdout.log").read_text()
    assert f"resumed from {attempt['resume_name']} at step {resumed}" in stdout
    assert f"done: {STEPS} steps ({STEPS - resumed} in this attempt)" in stdout
    steps = [
        json.loads(line)["step"]
        for line in (member_dir / "output" / "metrics.jsonl").read_text().splitlines()
    ]
    assert steps == list(range(resumed + 1, STEPS + 1))  # continues at the resumed step, none twice


def test_a_corrupt_newest_checkpoint_is_skipped_for_the_previous_verified_one(cluster: Cluster) -> None:
    """Issue 35: a byte flipped in the stored copy of the newest checkpoint. The retry's prepare meets it
    (the node gateway re-hashes what it serves), the checkpoint is marked corrupt and named in the
    timeline, and the job runs again from the previous verified checkpoint — without spending one of its
    max_attempts — and succeeds."""
    from tuneplane.app.artifacts.blobs import FsBlobStore

    cluster.start_agent("a")
    cluster.start_worker()
    job_id = cluster.submit(_spec())

    def damage(file: dict) -> None:  # the file's blob in the server's store (blobs are by content)
        path = FsBlobStore(cluster.data_dir / "blobs").path(file["sha256"])
        data = bytearray(path.read_bytes())
        data[0] ^= 0x01
        path.chmod(0o644)
        path.write_bytes(bytes(data))

    corrupt = cluster.resume_past_a_damaged_checkpoint(job_id, damage)
    assert corrupt["found_by"] == "the node gateway serving it to a node"
