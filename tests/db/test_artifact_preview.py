"""Artifacts at preview: inputs pinned by manifest digest; storage needs checked against the fleet."""

from __future__ import annotations

import pytest
from psycopg.types.json import Jsonb

from tests.artifact_fixtures import make_fleet_with, make_member
from tests.launch_fixtures import make_node, make_user
from tuneplane.app.db import Database
from tuneplane.app.errors import Refusal
from tuneplane.app.submission import service
from tuneplane.workers.artifacts.manifest import Manifest, ManifestFile

DEMO = {"recipe": {"name": "demo", "params": {"steps": 5}}, "fleet": "gpu"}
MANIFEST = Manifest((ManifestFile("model.bin", 3, "a" * 64), ManifestFile("config.json", 2, "b" * 64)))


def preview_count(db: Database) -> int:
    return db.fetch_one("SELECT count(*) AS n FROM previews")["n"]


def artifact(db: Database, setup, name: str = "checkpoint", complete: bool = True) -> dict:
    row = db.call(
        "register_artifact",
        setup.credential_hash,
        setup.member["id"],
        name,
        "checkpoint",
        "object",
        Jsonb(MANIFEST.as_json()),
        MANIFEST.digest,
        None,
    )[0]
    if complete:
        for i, f in enumerate(MANIFEST.files):
            row = db.call("record_artifact_file", setup.credential_hash, row["id"], i, f.sha256, f.size)[0]
    return row


def refused(db: Database, user: int, spec: dict) -> Refusal:
    before = preview_count(db)
    with pytest.raises(Refusal) as err:
        service.create_preview(db, user, spec)
    assert preview_count(db) == before, "a refused preview must store nothing"
    return err.value


def test_an_input_by_job_and_name_is_pinned_by_manifest_digest(db: Database) -> None:
    setup = make_member(db)
    art = artifact(db, setup)
    assert art["state"] == "complete"
    preview = service.create_preview(
        db, setup.user_id, {**DEMO, "inputs": [{"name": "base", "artifact": f"{setup.job_id}/checkpoint"}]}
    )
    pinned = preview["resolved"]["inputs"]
    assert len(pinned) == 1
    assert pinned[0]["manifest_digest"] == MANIFEST.digest and pinned[0]["artifact_id"] == art["id"]
    assert pinned[0]["job_id"] == setup.job_id and pinned[0]["rank"] == 0 and pinned[0]["attempt"] == 1
    assert any(MANIFEST.digest in line for line in preview["summary"]["inputs"])


def test_an_input_by_manifest_digest_is_pinned(db: Database) -> None:
    setup = make_member(db)
    art = artifact(db, setup)
    preview = service.create_preview(
        db, setup.user_id, {**DEMO, "inputs": [{"name": "base", "artifact": f"sha256:{MANIFEST.digest}"}]}
    )
    assert preview["resolved"]["inputs"][0]["artifact_id"] == art["id"]


def test_an_incomplete_input_is_refused_with_its_state(db: Database) -> None:
    setup = make_member(db)
    artifact(db, setup, complete=False)
    err = refused(
        db, setup.user_id, {**DEMO, "inputs": [{"name": "base", "artifact": f"{setup.job_id}/checkpoint"}]}
    )
    assert err.status == 422 and err.field == "inputs.0.artifact"
    assert "is uploading, not complete" in err.message


def test_unknown_and_other_users_artifacts_are_refused_as_unknown(db: Database) -> None:
    setup = make_member(db)
    artifact(db, setup)
    err = refused(
        db, setup.user_id, {**DEMO, "inputs": [{"name": "b", "artifact": f"{setup.job_id}/nothing"}]}
    )
    assert err.status == 404 and err.field == "inputs.0.artifact"
    mallory = make_user(db, "mallory")
    for ref in (f"{setup.job_id}/checkpoint", f"sha256:{MANIFEST.digest}"):
        err = refused(db, mallory, {**DEMO, "inputs": [{"name": "b", "artifact": ref}]})
        assert err.status == 404 and err.field == "inputs.0.artifact"
    err = refused(db, setup.user_id, {**DEMO, "inputs": [{"name": "b", "artifact": "not a ref"}]})
    assert err.status == 422 and "JOB/NAME" in err.message


def test_an_input_whose_last_verification_failed_is_refused(db: Database) -> None:
    setup = make_member(db)
    art = artifact(db, setup)
    db.call(
        "record_artifact_verification", setup.user_id, art["id"], False, 2, Jsonb(["mismatch: model.bin"])
    )
    err = refused(
        db, setup.user_id, {**DEMO, "inputs": [{"name": "b", "artifact": f"{setup.job_id}/checkpoint"}]}
    )
    assert "failed its last verification" in err.message and "model.bin" in err.message


def test_shared_mount_output_on_a_fleet_without_one_is_refused_at_preview(db: Database) -> None:
    setup = make_member(db, capabilities={"object_delivery": True})
    spec = {**DEMO, "outputs": [{"name": "model", "path": "model", "delivery": "shared"}]}
    err = refused(db, setup.user_id, spec)
    assert err.status == 422 and err.field == "outputs.0.delivery"
    assert "fleet gpu declares none" in err.message and "shared_mounts" in err.message

    nfs = make_fleet_with(
        db, "nfs", {"object_delivery": False, "shared_mounts": True, "shared_path": "/mnt/nfs"}
    )
    make_node(db, nfs, "nfs-1")
    ok = service.create_preview(db, setup.user_id, {**spec, "fleet": "nfs"})
    assert ok["resolved"]["outputs"][0]["delivery"] == "shared"
    err = refused(
        db,
        setup.user_id,
        {**spec, "fleet": "nfs", "outputs": [{"name": "m", "path": "m", "delivery": "object"}]},
    )
    assert err.field == "outputs.0.delivery" and "object_delivery false" in err.message
    # An object-delivered input cannot reach a fleet that can neither fetch objects nor see it.
    artifact(db, setup)
    err = refused(
        db,
        setup.user_id,
        {**DEMO, "fleet": "nfs", "inputs": [{"name": "b", "artifact": f"{setup.job_id}/checkpoint"}]},
    )
    assert err.field == "inputs.0.artifact" and "not on its shared mount" in err.message
