"""Outputs of a finished member reach the platform even when the agent dies in the middle of the upload."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.e2e.launch_cluster import Cluster
from tests.e2e.test_launch import _resources
from tests.helpers import wait_for
from tuneplane.app.artifacts.blobs import FsBlobStore
from tuneplane.app.artifacts.reader import verify_stored
from tuneplane.workers.artifacts.manifest import build_manifest

pytestmark = pytest.mark.e2e

MAKE_CHECKPOINT = """
import os, pathlib
out = pathlib.Path(os.environ["TUNEPLANE_OUTPUT_DIR"]) / "ckpt"
out.mkdir(parents=True, exist_ok=True)
(out / "weights.bin").write_bytes(os.urandom(48 * 1024 * 1024))
(out / "meta.json").write_text('{"step": 100}')
print("checkpoint written", flush=True)
"""


def _chunks(cluster: Cluster, job_id: int) -> int:
    return cluster.db.fetch_one(
        "SELECT count(*) AS n FROM artifact_chunks c JOIN artifacts a ON a.id = c.artifact_id"
        " WHERE a.job_id = %s",
        (job_id,),
    )["n"]


def test_agent_killed_mid_upload_resumes_after_restart_and_never_completes_wrong_bytes(
    cluster: Cluster,
) -> None:
    # Small chunks: the upload takes long enough to be interrupted in the middle.
    cluster.db.fetch_all("UPDATE artifact_settings SET chunk_size = 65536 RETURNING 1")
    agent = cluster.start_agent("a")
    # At start the agent checked its output and cache directories and reported them as a node event.
    note = wait_for(
        lambda: cluster.db.fetch_one(
            "SELECT reason, details FROM node_events WHERE kind = 'note' AND reason LIKE 'work directories%%'"
        ),
        timeout=10,
        what="the work-directory check event",
    )
    assert (
        note["details"]["workload_dirs"]["outputs"]["ok"] and note["details"]["workload_dirs"]["cache"]["ok"]
    )
    cluster.start_worker()
    archive = cluster.upload_source({"make.py": MAKE_CHECKPOINT})
    job_id = cluster.submit(
        {
            "source": {"archive": archive, "entrypoint": "python make.py", "integration": "script"},
            "resources": _resources(1),
            "outputs": [{"name": "ckpt", "path": "ckpt"}],
        }
    )
    wait_for(lambda: _chunks(cluster, job_id) >= 20, timeout=60, what="the upload to be under way")
    cluster.kill9(agent)
    artifact = cluster.db.fetch_one("SELECT * FROM artifacts WHERE job_id = %s AND name = 'ckpt'", (job_id,))
    assert artifact["state"] == "uploading", "the upload finished before the agent was killed"
    assert cluster.job(job_id)["state"] == "running"  # the member's end is not reported yet

    cluster.start_agent("a")
    job = cluster.wait_job(job_id, ("succeeded", "failed"), timeout=120)
    assert job["state"] == "succeeded", cluster.diagnose(job_id)
    # The restarted agent reported the end from its durable record at once; delivery resumed meanwhile.
    artifact = wait_for(
        lambda: cluster.db.fetch_one(
            "SELECT * FROM artifacts WHERE job_id = %s AND name = 'ckpt' AND state <> 'uploading'", (job_id,)
        ),
        timeout=120,
        what="the resumed upload to end",
    )
    assert artifact["state"] == "complete", artifact
    (member,) = cluster.members(job_id)
    local = build_manifest(cluster.member_dir("a", member["id"]) / "output" / "ckpt")
    assert artifact["manifest_digest"] == local.digest
    report = verify_stored(FsBlobStore(Path(cluster.data_dir) / "blobs"), artifact)
    assert report.ok, report
