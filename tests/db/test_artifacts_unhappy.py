"""Artifact delivery's unhappy paths over real HTTP on loopback with real files: what once wedged a
delivery (retried until the agent's deadline) now ends, and never with wrong bytes."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from app.db import Database
from tests.artifact_fixtures import make_member, served_artifacts, write_tree
from workers.artifacts.deliver import deliver_artifact, node_http, register
from workers.artifacts.manifest import build_manifest
from workers.artifacts.upload import HttpChunkTransport, UploadError, upload_artifact

CHUNK = 4096


@pytest.fixture
def env(db: Database, db_url: str, tmp_path: Path, port: int):
    with served_artifacts(db, db_url, tmp_path, port, CHUNK) as served:
        yield served


def test_an_empty_output_directory_completes_by_object_and_shared_delivery(db: Database, env) -> None:
    # Before: finish answered 500 (a NULL reason) and the artifact stayed uploading until the deadline.
    shared_root = env["tmp"] / "shared"
    setup = make_member(
        db, capabilities={"object_delivery": True, "shared_mounts": True, "shared_path": str(shared_root)}
    )
    empty = env["tmp"] / "empty"
    empty.mkdir()
    with node_http(env["url"], setup.credential) as http:
        by_object = deliver_artifact(http, setup.member["id"], "model", empty)
        by_shared = deliver_artifact(
            http, setup.member["id"], "shared", empty, delivery="shared",
            shared_path=str(shared_root / "jobs" / "model"),
        )  # fmt: skip
    for art in (by_object, by_shared):
        assert art["state"] == "complete", art
        assert art["file_count"] == 0 and "verified 0 files" in art["reason"]


def test_an_assembly_cut_short_by_the_blob_store_is_redone_when_the_upload_finishes(
    db: Database, env
) -> None:
    # Every chunk of every file is recorded, but placing the files in the blob store fails (a file stands
    # where its sha256/ directory belongs: the store unwritable at that moment, as a full disk would be).
    # Before: the agent's next pass found no chunk missing, finish changed nothing, and the artifact stayed
    # uploading for ever.
    setup = make_member(db)
    src = env["tmp"] / "out"
    files = {"a.bin": os.urandom(3 * CHUNK + 5), "b.bin": os.urandom(CHUNK), "c.txt": b"c"}
    manifest = write_tree(src, files)
    blocker = env["blob_dir"] / "sha256"
    with node_http(env["url"], setup.credential) as http:
        art = register(http, setup.member["id"], "model", manifest)
        blocker.parent.mkdir(parents=True, exist_ok=True)
        blocker.write_bytes(b"")
        with pytest.raises(UploadError, match="HTTP 500"):
            upload_artifact(src, manifest, HttpChunkTransport(http, art["id"], retries=0), parallel=1)
        # Upload the rest while the store stays broken: all chunks recorded, no file verified.
        for _ in range(len(files)):
            try:
                upload_artifact(src, manifest, HttpChunkTransport(http, art["id"], retries=0), parallel=1)
            except UploadError:
                continue
        held = db.fetch_all(
            "SELECT file_index, count(*) AS n FROM artifact_chunks WHERE artifact_id = %s"
            " GROUP BY 1 ORDER BY 1",
            (art["id"],),
        )
        assert [r["n"] for r in held] == [4, 1, 1]
        blocker.unlink()
        result = upload_artifact(src, manifest, HttpChunkTransport(http, art["id"], retries=0))
    assert result.state == "complete" and result.chunks_sent == 0, result
    for data in files.values():
        sha = hashlib.sha256(data).hexdigest()
        assert (env["blob_dir"] / "sha256" / sha[:2] / sha).read_bytes() == data
    assert build_manifest(src).digest == manifest.digest
