from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from psycopg.types.json import Jsonb

from tests.artifact_fixtures import give_credential, make_member, write_tree
from tests.launch_fixtures import make_user
from tuneplane.app.db import Database
from tuneplane.app.errors import Refusal


def register(db: Database, setup, manifest, name="model", delivery="object", shared_path=None, digest=None):
    return db.call(
        "register_artifact",
        setup.credential_hash,
        setup.member["id"],
        name,
        "output",
        delivery,
        Jsonb(manifest.as_json()),
        digest or manifest.digest,
        shared_path,
    )[0]


def test_database_computes_the_same_manifest_digest_as_python(db: Database, tmp_path: Path) -> None:
    manifest = write_tree(
        tmp_path,
        {"b.bin": os.urandom(1000), 'a/naïve ü \\ "q".txt': b"x", "a/empty": b"", "Z": b"upper"},
    )
    row = db.fetch_one(
        "SELECT artifact_manifest_canonical(%s) AS text, artifact_manifest_digest(%s) AS digest",
        (Jsonb(manifest.as_json()), Jsonb(manifest.as_json())),
    )
    assert row["text"].encode() == manifest.canonical_bytes()
    assert row["digest"] == manifest.digest


def test_register_refuses_a_digest_that_does_not_match_the_manifest(db: Database, tmp_path: Path) -> None:
    setup = make_member(db)
    manifest = write_tree(tmp_path, {"w.bin": b"weights"})
    with pytest.raises(Refusal) as err:
        register(db, setup, manifest, digest="0" * 64)
    assert err.value.status == 400 and err.value.field == "manifest_digest"


@pytest.mark.parametrize("bad_path", ["../escape", "/abs", "a//b", "a/./b", "ctl\u0001"])
def test_register_refuses_unsafe_manifest_paths(db: Database, bad_path: str) -> None:
    setup = make_member(db)
    manifest = {"files": [{"path": bad_path, "sha256": "0" * 64, "size": 1}], "version": 1}
    digest = db.fetch_one("SELECT artifact_manifest_digest(%s) AS d", (Jsonb(manifest),))["d"]
    with pytest.raises(Refusal) as err:
        db.call(
            "register_artifact",
            setup.credential_hash,
            setup.member["id"],
            "m",
            "output",
            "object",
            Jsonb(manifest),
            digest,
            None,
        )
    assert err.value.status == 400 and "unsafe manifest path" in err.value.message


def test_another_nodes_credential_cannot_register_for_a_member(db: Database, tmp_path: Path) -> None:
    setup = make_member(db)
    other = make_member(db, user_id=setup.user_id, fleet_id=setup.fleet_id, fleet="gpu2")
    manifest = write_tree(tmp_path, {"w.bin": b"weights"})
    with pytest.raises(Refusal) as err:
        db.call(
            "register_artifact",
            other.credential_hash,
            setup.member["id"],
            "m",
            "output",
            "object",
            Jsonb(manifest.as_json()),
            manifest.digest,
            None,
        )
    assert err.value.status == 403
    with pytest.raises(Refusal) as err:
        db.call(
            "register_artifact",
            "f" * 64,
            setup.member["id"],
            "m",
            "output",
            "object",
            Jsonb(manifest.as_json()),
            manifest.digest,
            None,
        )
    assert err.value.status == 401


def test_complete_needs_every_file_verified_and_then_nothing_changes(db: Database, tmp_path: Path) -> None:
    setup = make_member(db)
    manifest = write_tree(tmp_path, {"a.bin": b"aaa", "b.bin": b"bbbb"})
    art = register(db, setup, manifest)
    assert art["state"] == "uploading" and art["file_count"] == 2 and art["total_bytes"] == 7
    files = {f.path: f for f in manifest.files}
    with pytest.raises(Refusal) as err:
        db.call("record_artifact_file", setup.credential_hash, art["id"], 0, "1" * 64, 3)
    assert err.value.status == 409
    first = db.call("record_artifact_file", setup.credential_hash, art["id"], 0, files["a.bin"].sha256, 3)[0]
    assert first["state"] == "uploading"
    with (
        pytest.raises(Refusal, match="cannot be complete while a file is unverified"),
        db.transaction() as conn,
    ):
        conn.execute(
            "UPDATE artifacts SET state = 'complete', completed_at = now() WHERE id = %s", (art["id"],)
        )
    done = db.call("record_artifact_file", setup.credential_hash, art["id"], 1, files["b.bin"].sha256, 4)[0]
    assert done["state"] == "complete" and done["completed_at"] is not None
    for statement in (
        "UPDATE artifacts SET manifest_digest = repeat('e', 64) WHERE id = %s",
        "UPDATE artifacts SET state = 'failed' WHERE id = %s",
        "DELETE FROM artifacts WHERE id = %s",
        "UPDATE artifact_files SET sha256 = repeat('e', 64) WHERE artifact_id = %s",
        "DELETE FROM artifact_files WHERE artifact_id = %s",
    ):
        with pytest.raises(Refusal, match="immutable"), db.transaction() as conn:
            conn.execute(statement, (art["id"],))
    with pytest.raises(Refusal) as err:
        db.call("fail_artifact", setup.credential_hash, art["id"], "too late")
    assert err.value.status == 409


def test_registering_again_resumes_and_a_changed_manifest_is_refused_once_complete(
    db: Database, tmp_path: Path
) -> None:
    setup = make_member(db)
    manifest = write_tree(tmp_path, {"a.bin": b"aaa"})
    art = register(db, setup, manifest)
    db.call(
        "record_artifact_chunk", setup.credential_hash, art["id"], 0, 0, 3, manifest.files[0].sha256, None
    )
    again = register(db, setup, manifest)
    assert again["id"] == art["id"]
    status = db.call("artifact_upload_status", setup.credential_hash, art["id"])[0]["artifact_upload_status"]
    assert status["files"][0]["chunks"] == [0]
    db.call("record_artifact_file", setup.credential_hash, art["id"], 0, manifest.files[0].sha256, 3)
    (tmp_path / "a.bin").write_bytes(b"changed")
    from tuneplane.workers.artifacts.manifest import build_manifest

    with pytest.raises(Refusal) as err:
        register(db, setup, build_manifest(tmp_path))
    assert err.value.status == 409 and "immutable" in err.value.message


def test_chunk_sizes_and_indexes_are_checked(db: Database, tmp_path: Path) -> None:
    setup = make_member(db)
    db.fetch_one("UPDATE artifact_settings SET chunk_size = 4096 RETURNING chunk_size")
    manifest = write_tree(tmp_path, {"big.bin": os.urandom(10_000)})
    art = register(db, setup, manifest)
    target = db.call("artifact_upload_target", setup.credential_hash, art["id"], 0, 2, 10_000 - 8192)[0]
    assert target["chunk_count"] == 3
    with pytest.raises(Refusal, match="must be 4096 bytes"):
        db.call("artifact_upload_target", setup.credential_hash, art["id"], 0, 0, 100)
    with pytest.raises(Refusal, match="outside the file"):
        db.call("artifact_upload_target", setup.credential_hash, art["id"], 0, 3, 100)


def test_shared_delivery_needs_a_fleet_with_a_shared_mount(db: Database, tmp_path: Path) -> None:
    setup = make_member(db, capabilities={"object_delivery": True})
    manifest = write_tree(tmp_path, {"a.bin": b"aaa"})
    with pytest.raises(Refusal, match="declares no shared mount") as err:
        register(db, setup, manifest, delivery="shared", shared_path="/mnt/shared/x")
    assert err.value.status == 409
    shared = make_member(
        db,
        user_id=setup.user_id,
        fleet="nfs",
        capabilities={"object_delivery": False, "shared_mounts": True, "shared_path": "/mnt/shared"},
    )
    with pytest.raises(Refusal, match="does not declare object_delivery"):
        register(db, shared, manifest)
    with pytest.raises(Refusal, match="under the fleet's shared path"):
        register(db, shared, manifest, delivery="shared", shared_path="/mnt/other/x")
    with pytest.raises(Refusal, match="under the fleet's shared path"):
        register(db, shared, manifest, delivery="shared", shared_path="/mnt/shared/../etc")
    ok = register(db, shared, manifest, delivery="shared", shared_path="/mnt/shared/job/model/")
    assert ok["shared_path"] == "/mnt/shared/job/model"


def test_users_see_only_their_own_jobs_artifacts(db: Database, tmp_path: Path) -> None:
    setup = make_member(db)
    manifest = write_tree(tmp_path, {"a.bin": b"aaa"})
    art = register(db, setup, manifest)
    listed = db.call("job_artifacts", setup.user_id, setup.job_id)
    assert [(a["name"], a["state"], a["attempt"], a["rank"]) for a in listed] == [
        ("model", "uploading", 1, 0)
    ]
    assert db.call("find_artifact", setup.user_id, setup.job_id, "model", None, None)[0]["id"] == art["id"]
    mallory = make_user(db, "mallory")
    admin = make_user(db, "root", "admin")
    with pytest.raises(Refusal) as err:
        db.call("job_artifacts", mallory, setup.job_id)
    assert err.value.status == 404
    with pytest.raises(Refusal):
        db.call("artifact_for_user", mallory, art["id"])
    assert db.call("artifact_for_user", admin, art["id"])[0]["id"] == art["id"]
    with pytest.raises(Refusal) as err:
        db.call("find_artifact", setup.user_id, setup.job_id, "nope", None, None)
    assert err.value.status == 404


def test_a_second_credential_of_the_same_node_may_continue(db: Database, tmp_path: Path) -> None:
    setup = make_member(db)
    manifest = write_tree(tmp_path, {"a.bin": b"aaa"})
    art = register(db, setup, manifest)
    _plain, second = give_credential(db, setup.node_id)
    status = db.call("artifact_upload_status", second, art["id"])[0]["artifact_upload_status"]
    assert status["state"] == "uploading" and json.dumps(status)


def test_an_operator_can_fail_an_abandoned_upload_but_not_a_complete_artifact(
    db: Database, tmp_path: Path
) -> None:
    setup = make_member(db)
    manifest = write_tree(tmp_path, {"a.bin": b"aaa"})
    art = register(db, setup, manifest)
    failed = db.call("operator_fail_artifact", art["id"], "node retired")[0]
    assert failed["state"] == "failed" and failed["reason"] == "operator: node retired"
    again = register(db, setup, manifest)
    assert again["id"] == art["id"] and again["state"] == "uploading"
    done = db.call("record_artifact_file", setup.credential_hash, art["id"], 0, manifest.files[0].sha256, 3)[
        0
    ]
    assert done["state"] == "complete"
    with pytest.raises(Refusal) as err:
        db.call("operator_fail_artifact", art["id"], "oops")
    assert err.value.status == 409
