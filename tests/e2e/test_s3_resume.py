"""Issue 32, acceptance 1: on a fleet whose store is a real SeaweedFS, the demo fine-tune and
examples/finetune-hf publish checkpoints while they run (straight to the store, verified by the server
side), are preempted, and resume from the store: the retry's node fetches the checkpoint with presigned
GETs and verifies it before the workload starts. The server's blob directory never holds a byte of them.
A byte flipped in the store's copy of the newest checkpoint is found when the retry prepares, confirmed by
the server's own re-read, and the job runs again from the previous verified checkpoint (issue 35)."""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import Iterator
from pathlib import Path

import pytest
from psycopg.types.json import Jsonb

from tests.e2e.launch_cluster import MIB, Cluster
from tests.e2e.test_finetune_hf import SAVE_STEPS, _start, _submit, needs_torch
from tests.e2e.test_finetune_hf import STEPS as HF_STEPS
from tests.seaweed_store import ACCESS_KEY, BUCKET, SECRET_KEY
from tuneplane.app import db_functions as fn
from tuneplane.app.db import Database
from tuneplane.app.s3store import S3Credentials, S3Location, S3Store

pytestmark = pytest.mark.e2e

STEPS, EVERY = 400, 50


@pytest.fixture
def s3_cluster(
    db_url: str, db: Database, tmp_path: Path, port: int, seaweed
) -> Iterator[tuple[Cluster, S3Store]]:
    """The e2e cluster whose fleet stores its artifacts in SeaweedFS; only the node gateway holds the keys."""
    cluster = Cluster(db_url, db, tmp_path, port)
    cluster.server_env = {
        "TUNEPLANE_S3_ACCESS_KEY_ID": ACCESS_KEY,
        "TUNEPLANE_S3_SECRET_ACCESS_KEY": SECRET_KEY,
    }
    cluster.start()
    prefix = f"e2e/{secrets.token_hex(4)}"
    storage = {"kind": "s3", "bucket": BUCKET, "prefix": prefix, "endpoint": seaweed.endpoint}
    db.call(fn.set_fleet_storage, cluster.fleet, Jsonb(storage), None)
    store = S3Store(S3Location(seaweed.endpoint, BUCKET, prefix), S3Credentials(ACCESS_KEY, SECRET_KEY))
    try:
        yield cluster, store
    finally:
        cluster.stop_all()


def _demo(cluster: Cluster, **extra) -> int:
    return cluster.submit(
        {
            "recipe": {
                "name": "demo",
                "params": {"steps": STEPS, "step_seconds": 0.05, "checkpoint_every": EVERY},
            },
            "resources": {"gpus_per_node": 1, "cpus_per_node": 1, "memory_per_node": 256 * MIB},
            **extra,
        }
    )


def _assert_bytes_only_in_store(cluster: Cluster, store: S3Store, job_id: int) -> int:
    """Every file of the job's complete artifacts is an object in the store whose bytes hash to the manifest,
    and the server's blob directory holds no blob and no staged chunk. Returns the files checked."""
    complete = "SELECT id FROM artifacts WHERE job_id = %s AND state = 'complete'"
    arts = cluster.db.fetch_all(complete, (job_id,))
    files = [f for a in arts for f in cluster.db.call(fn.artifact_file_list, a["id"]) if f["size"] > 0]
    assert files
    for f in files:  # where the database says the verified object lives (artifact_object_key)
        assert store.verify(store.key(f["object_key"]), f["sha256"], f["size"]), f["path"]
    blobs = cluster.data_dir / "blobs"
    on_disk = {p.name for p in (blobs / "sha256").rglob("*") if p.is_file()} if blobs.exists() else set()
    # Nor the capsules the members ran (the worker wrote them to the store, the nodes fetched them there),
    # nor a source archive: the server's blob directory holds no blob at all.
    assert on_disk == set(), f"blobs in the server's blob directory: {sorted(on_disk)}"
    capsules = {r["capsule_digest"] for r in cluster.db.fetch_all(
        "SELECT capsule_digest FROM attempts WHERE job_id = %s", (job_id,))}  # fmt: skip
    assert capsules and None not in capsules
    for digest in capsules:
        assert store.exists(digest)
    staged = blobs / "staging"
    assert not staged.exists() or not [p for p in staged.rglob("*") if p.is_file()]
    return len(files)


def test_the_demo_publishes_to_the_store_is_preempted_and_resumes_from_it(s3_cluster) -> None:
    cluster, store = s3_cluster
    cluster.start_agent("a", "--simulate-gpus", "2")
    cluster.start_worker()
    job_id = _demo(cluster, preemption={"grace_seconds": 60})
    first = cluster.preempt_after_a_checkpoint(job_id, "e2e: preempted on an S3 fleet", timeout=60)
    member, saved = cluster.resumed_after_preemption(job_id, first)  # from the store, verified at prepare
    stdout = cluster.member_log(member)
    assert f"resumed from {first['end_checkpoint']} at step {saved}" in stdout
    assert f"done: {STEPS} steps ({STEPS - saved} in this attempt)" in stdout
    assert _assert_bytes_only_in_store(cluster, store, job_id) >= 2


def test_a_byte_flipped_in_the_store_is_never_resumed_from(s3_cluster) -> None:
    cluster, store = s3_cluster
    cluster.start_agent("a")
    cluster.start_worker()
    job_id = _demo(cluster, max_attempts=2, resources={"cpus_per_node": 1, "memory_per_node": 256 * MIB})

    def damage(file: dict) -> None:  # the file's object, where the database says it lives
        key = store.key(file["object_key"])
        data = bytearray(store.open_key(key).read())
        data[0] ^= 0x01
        store.put_bytes(key, bytes(data))
        assert hashlib.sha256(data).hexdigest() != file["sha256"]

    corrupt = cluster.resume_past_a_damaged_checkpoint(job_id, damage)
    assert "re-reading the store" in corrupt["found_by"], corrupt  # the server's hash, not the node's word


@needs_torch
def test_finetune_hf_publishes_to_the_store_is_preempted_and_resumes_from_it(s3_cluster) -> None:
    cluster, store = s3_cluster
    archive = _start(cluster, store=store)  # the source archive in the store too (POST /sources?fleet=)
    job_id = _submit(cluster, archive, f"--steps {HF_STEPS} --save-steps {SAVE_STEPS} --step-seconds 0.5")
    first = cluster.preempt_after_a_checkpoint(job_id, "e2e: mid-run", checkpoint_timeout=240, timeout=120)
    k = first["end_checkpoint_step"]
    assert k is not None and SAVE_STEPS <= k < HF_STEPS, first
    done = cluster.wait_job(job_id, ("succeeded", "failed", "cancelled"), timeout=240)
    assert done["state"] == "succeeded", cluster.explain(job_id)
    assert cluster.attempt(job_id, 2)["resume_artifact_id"] == first["end_checkpoint_id"]
    (member,) = cluster.members_of_attempt(job_id, 2)
    stdout = cluster.member_log(member)
    assert f"resuming from {first['end_checkpoint']}: checkpoint-{k} " in stdout, stdout[-2000:]
    assert f"done: {HF_STEPS} steps" in stdout, stdout[-2000:]
    assert _assert_bytes_only_in_store(cluster, store, job_id) >= 1
