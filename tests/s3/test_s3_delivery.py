"""Direct delivery to a real SeaweedFS (issue 32): the node uploads parts to presigned URLs, the server
completes, verifies each object off the node against the manifest and only then records it; resume after a
restart sends only the missing parts; bytes that do not match the manifest fail the artifact."""

from __future__ import annotations

import secrets
from pathlib import Path

import pytest
from psycopg.types.json import Jsonb

from tests.artifact_fixtures import give_credential, make_member, write_tree
from tests.launch_fixtures import make_node
from tests.seaweed_store import ACCESS_KEY, BUCKET, SECRET_KEY, assert_stored_verified
from tuneplane.app.artifacts.s3_delivery import S3Delivery
from tuneplane.app.db import Database
from tuneplane.app.errors import Refusal
from tuneplane.app.s3store import MIN_PART_SIZE, S3Credentials, S3Location, S3Store
from tuneplane.workers.artifacts.s3_upload import parts_to_send, upload_parts

MiB = 1024 * 1024


@pytest.fixture
def delivery(seaweed, db: Database) -> S3Delivery:
    store = S3Store(S3Location(seaweed.endpoint, BUCKET, f"d/{secrets.token_hex(4)}"),
                    S3Credentials(ACCESS_KEY, SECRET_KEY))  # fmt: skip
    return S3Delivery(db, store, part_size=MIN_PART_SIZE)


def _register(db: Database, setup, root: Path, files: dict[str, bytes]) -> tuple[dict, object]:
    manifest = write_tree(root, files)
    art = db.call(
        "register_artifact", setup.credential_hash, setup.member["id"], "checkpoint-1", "checkpoint",
        "object", Jsonb(manifest.as_json()), manifest.digest, None, 1,
    )[0]  # fmt: skip
    return art, manifest


def _deliver(delivery: S3Delivery, cred: str, art: dict, root: Path, manifest) -> dict:
    result = art
    for index, entry in enumerate(manifest.files):
        plan = delivery.begin(cred, art["id"], index)
        if plan["verified"]:
            continue

        def presign(parts, index=index, plan=plan):
            return delivery.presign(cred, art["id"], index, plan["upload_id"], parts)

        upload_parts(root / entry.path, plan, presign)
        result = delivery.complete(cred, art["id"], index, plan["upload_id"])
    return result


def test_direct_upload_is_verified_off_the_node_then_complete(db: Database, delivery: S3Delivery, tmp_path):
    setup = make_member(db)
    files = {"model/weights.bin": secrets.token_bytes(11 * MiB + 5), "config.json": b'{"lr": 0.1}'}
    art, manifest = _register(db, setup, tmp_path / "out", files)
    assert art["state"] == "uploading"
    done = _deliver(delivery, setup.credential_hash, art, tmp_path / "out", manifest)
    assert done["state"] == "complete"
    # Verified where the node uploaded it (no copy to a content address), no open upload.
    assert_stored_verified(db, delivery.store, art["id"])


def test_resume_sends_only_the_missing_parts(db: Database, delivery: S3Delivery, tmp_path) -> None:
    setup = make_member(db)
    data = secrets.token_bytes(3 * MIN_PART_SIZE + 100)
    art, _ = _register(db, setup, tmp_path / "out", {"w.bin": data})
    cred = setup.credential_hash
    plan = delivery.begin(cred, art["id"], 0)
    assert [p[0] for p in parts_to_send(plan)] == [1, 2, 3, 4]

    def presign(parts):
        return delivery.presign(cred, art["id"], 0, plan["upload_id"], parts)

    first_two = {**plan, "size": 2 * MIN_PART_SIZE}  # the agent was killed after two parts
    assert upload_parts(tmp_path / "out" / "w.bin", first_two, presign) == 2
    with pytest.raises(Refusal, match="holds parts \\[1, 2\\]") as refused:  # never a short object
        delivery.complete(cred, art["id"], 0, plan["upload_id"])
    assert refused.value.status == 409
    again = delivery.begin(cred, art["id"], 0)  # the restarted agent: same upload, parts listed by the store
    assert again["upload_id"] == plan["upload_id"]
    assert [p["part_number"] for p in again["parts"]] == [1, 2]
    assert upload_parts(tmp_path / "out" / "w.bin", again, presign) == 2  # parts 3 and 4 only
    assert delivery.complete(cred, art["id"], 0, plan["upload_id"])["state"] == "complete"


def test_bytes_that_do_not_match_the_manifest_fail_the_artifact(db: Database, delivery: S3Delivery, tmp_path):
    setup = make_member(db)
    data = secrets.token_bytes(MIN_PART_SIZE + 10)
    art, manifest = _register(db, setup, tmp_path / "out", {"w.bin": data})
    # The file changes after its manifest was built (same size): every part's CRC32C is right for the bytes
    # sent, so the store accepts them; only the server's sha256 check finds it.
    (tmp_path / "out" / "w.bin").write_bytes(bytes([data[0] ^ 1]) + data[1:])
    failed = _deliver(delivery, setup.credential_hash, art, tmp_path / "out", manifest)
    assert failed["state"] == "failed" and "manifest says" in failed["reason"]
    store = delivery.store  # the unverified object is gone, no upload stays open
    assert list(store.list_keys("artifacts/")) == [] and store.open_uploads() == []


def test_a_failed_artifact_registered_again_replaces_its_old_objects(
    db: Database, delivery: S3Delivery, tmp_path: Path
) -> None:
    """An object verified for an earlier manifest of the artifact lies at the key the new upload writes:
    completing takes the new upload's parts, never the old object in their place."""
    setup = make_member(db)
    cred = setup.credential_hash
    files = {"w.bin": secrets.token_bytes(1000), "x.bin": secrets.token_bytes(10)}
    art, _ = _register(db, setup, tmp_path / "v1", files)
    plan = delivery.begin(cred, art["id"], 0)
    upload_parts(tmp_path / "v1" / "w.bin", plan,
                 lambda parts: delivery.presign(cred, art["id"], 0, plan["upload_id"], parts))  # fmt: skip
    assert delivery.complete(cred, art["id"], 0, plan["upload_id"])["state"] == "uploading"
    db.call("fail_artifact", cred, art["id"], "the member was lost before x.bin")
    files["w.bin"] = secrets.token_bytes(1000)  # the next try wrote other bytes
    again, manifest = _register(db, setup, tmp_path / "v2", files)
    assert again["id"] == art["id"] and again["state"] == "uploading"
    assert _deliver(delivery, cred, again, tmp_path / "v2", manifest)["state"] == "complete"
    assert_stored_verified(db, delivery.store, art["id"])


def test_another_node_gets_no_url(db: Database, delivery: S3Delivery, tmp_path) -> None:
    setup = make_member(db)
    art, _ = _register(db, setup, tmp_path / "out", {"w.bin": secrets.token_bytes(1000)})
    _, other = give_credential(db, make_node(db, setup.fleet_id, "other", gpus=1))
    with pytest.raises(Refusal):
        delivery.begin(other, art["id"], 0)
    plan = delivery.begin(setup.credential_hash, art["id"], 0)
    with pytest.raises(Refusal):
        delivery.presign(other, art["id"], 0, plan["upload_id"], [{"part_number": 1, "crc32c": "x"}])
    with pytest.raises(Refusal, match="parts"):
        delivery.presign(setup.credential_hash, art["id"], 0, plan["upload_id"],
                         [{"part_number": 1, "crc32c": "not-crc"}])  # fmt: skip


def test_gc_aborts_the_uploads_of_artifacts_that_no_longer_upload(
    db: Database, delivery: S3Delivery, tmp_path
):
    from tuneplane.app.artifacts.s3_delivery import abort_stale_uploads

    setup = make_member(db)
    cred = setup.credential_hash
    art, _ = _register(db, setup, tmp_path / "a", {"w.bin": secrets.token_bytes(MIN_PART_SIZE + 1)})
    plan = delivery.begin(cred, art["id"], 0)  # the agent was killed after one part
    upload_parts(tmp_path / "a" / "w.bin", {**plan, "size": MIN_PART_SIZE},
                 lambda parts: delivery.presign(cred, art["id"], 0, plan["upload_id"], parts))  # fmt: skip
    store = delivery.store
    assert abort_stale_uploads(db, store, min_age=0) == []  # still uploading: kept for the agent's resume
    db.call("fail_artifact", cred, art["id"], "the member was lost")
    assert abort_stale_uploads(db, store, min_age=3600) == []  # too young to be sure
    assert abort_stale_uploads(db, store, min_age=0) == [delivery.upload_key(art["id"], 0)]
    assert store.open_uploads() == []
