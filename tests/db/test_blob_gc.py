"""Blob garbage collection against real uploads over HTTP: what the database still references (artifacts,
source archives, capsules) stays, the rest goes, and collections racing uploads never remove a blob an
upload is about to record (app/artifacts/gc.py). Also checkpoint retention, which makes blobs garbage."""

from __future__ import annotations

import hashlib
import os
import threading
from pathlib import Path

import pytest

from tests.artifact_fixtures import make_member, served_artifacts, write_tree
from tuneplane.app.artifacts.blobs import FsBlobStore
from tuneplane.app.artifacts.gc import collect
from tuneplane.app.artifacts.reader import verify_stored
from tuneplane.app.db import Database
from tuneplane.app.errors import Refusal
from tuneplane.workers.artifacts.deliver import deliver_artifact, node_http

CHUNK = 4096


@pytest.fixture
def env(db: Database, db_url: str, tmp_path: Path, port: int):
    with served_artifacts(db, db_url, tmp_path, port, CHUNK) as served:
        yield served


def plant_blob(blob_dir: Path, data: bytes) -> str:
    sha = hashlib.sha256(data).hexdigest()
    path = FsBlobStore(blob_dir).path(sha)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return sha


def deliver(env, setup, name: str, files: dict[str, bytes], kind: str = "output") -> dict:
    src = env["tmp"] / f"src-{name}"
    write_tree(src, files)
    with node_http(env["url"], setup.credential) as http:
        return deliver_artifact(http, setup.member["id"], name, src, kind=kind)


def test_checkpoint_retention_keeps_the_newest_and_prunes_the_rest_immutably(db: Database, env) -> None:
    db.fetch_one("UPDATE artifact_settings SET keep_checkpoints = 2 RETURNING 1")
    setup = make_member(db)
    made = [deliver(env, setup, f"ckpt.{n}", {"w.bin": os.urandom(3000)}, "checkpoint") for n in (1, 2, 3)]
    assert all(a["state"] == "complete" for a in made)
    states = {
        r["name"]: r["state"]
        for r in db.fetch_all("SELECT name, state FROM artifacts WHERE job_id = %s", (setup.job_id,))
    }
    assert states == {"ckpt.1": "pruned", "ckpt.2": "complete", "ckpt.3": "complete"}
    # Pruned is final: the manifest stays, nothing else may change it, and it cannot come back.
    with pytest.raises(Refusal, match="immutable"):
        db.fetch_one("UPDATE artifacts SET state = 'complete' WHERE id = %s RETURNING 1", (made[0]["id"],))
    with pytest.raises(Refusal, match="immutable"):  # pruning changes the state, never the manifest
        db.fetch_one(
            "UPDATE artifacts SET state = 'pruned', pruned_at = now(), total_bytes = 1"
            " WHERE id = %s RETURNING 1",
            (made[1]["id"],),
        )


def test_gc_under_concurrent_uploads_removes_only_unreferenced_blobs(db: Database, env) -> None:
    blob_dir = env["blob_dir"]
    db.fetch_one("UPDATE artifact_settings SET keep_checkpoints = 1 RETURNING 1")
    setup = make_member(db)
    kept = deliver(env, setup, "model", {"weights.bin": os.urandom(5 * CHUNK + 7), "empty.txt": b""})
    # A pruned checkpoint whose bytes a later upload will reuse (the race that matters: GC deciding a
    # blob is garbage while a new artifact is found to need it), and one whose bytes nobody reuses.
    reused_bytes, lone_bytes = os.urandom(2 * CHUNK + 1), os.urandom(CHUNK + 3)
    deliver(env, setup, "ckpt.1", {"a.bin": reused_bytes}, "checkpoint")
    deliver(env, setup, "ckpt.2", {"b.bin": lone_bytes}, "checkpoint")
    deliver(env, setup, "ckpt.3", {"c.bin": os.urandom(100)}, "checkpoint")
    # A source archive and a capsule the database references, and two blobs nothing references.
    archive = plant_blob(blob_dir, b"archive bytes " + os.urandom(64))
    db.fetch_one(
        "INSERT INTO source_archives (sha256, size_bytes, member_count, unpacked_bytes)"
        " VALUES (%s, 78, 1, 1) RETURNING 1",
        (archive,),
    )
    capsule = plant_blob(blob_dir, b"capsule bytes " + os.urandom(64))
    db.fetch_one(
        "UPDATE attempts SET capsule_digest = %s WHERE job_id = %s RETURNING 1", (capsule, setup.job_id)
    )
    stray = [plant_blob(blob_dir, os.urandom(500)) for _ in range(3)]

    uploads: list[dict] = []
    errors: list[BaseException] = []
    done = threading.Event()

    def upload(n: int) -> None:
        try:
            files = {
                "x.bin": os.urandom(4 * CHUNK + n),
                "again.bin": reused_bytes if n % 2 == 0 else b"z" * n,
            }
            uploads.append(deliver(env, setup, f"late-{n}", files))
        except BaseException as exc:
            errors.append(exc)

    def collect_repeatedly() -> None:
        while not done.is_set():
            collect(db, blob_dir, min_age=0)

    collector = threading.Thread(target=collect_repeatedly)
    collector.start()
    threads = [threading.Thread(target=upload, args=(n,)) for n in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    done.set()
    collector.join(timeout=60)
    assert not errors, errors
    report = collect(db, blob_dir, min_age=0)

    store = FsBlobStore(blob_dir)
    complete = db.fetch_all("SELECT * FROM artifacts WHERE state = 'complete' ORDER BY id")
    assert {a["name"] for a in complete} >= {"model", "ckpt.3", *(f"late-{n}" for n in range(8))}
    assert all(u["state"] == "complete" for u in uploads) and len(uploads) == 8
    for artifact in complete:  # every file of every complete artifact is still there, byte for byte
        assert verify_stored(store, artifact).ok, artifact["name"]
    assert store.has(archive) and store.has(capsule)
    assert store.has(hashlib.sha256(reused_bytes).hexdigest())  # pruned, then needed again
    assert not store.has(hashlib.sha256(lone_bytes).hexdigest())  # pruned and needed by nobody
    assert not any(store.has(s) for s in stray)
    assert report.removed == [] and kept["state"] == "complete"


def test_recent_unreferenced_blobs_survive_a_collection(db: Database, env) -> None:
    fresh = plant_blob(env["blob_dir"], os.urandom(100))
    old = plant_blob(env["blob_dir"], os.urandom(100))
    past = os.path.getmtime(FsBlobStore(env["blob_dir"]).path(old)) - 7200
    os.utime(FsBlobStore(env["blob_dir"]).path(old), (past, past))
    report = collect(db, env["blob_dir"], min_age=3600)
    assert report.removed == [old] and report.kept_recent == 1
    assert FsBlobStore(env["blob_dir"]).has(fresh)


class PausedAfterReferences:
    """The Database a collection uses, pausing right after it read blob_references() (until `proceed` or
    two seconds), so a test can act between the collection's reading and its deleting."""

    def __init__(self, db: Database) -> None:
        self.db, self.read, self.proceed = db, threading.Event(), threading.Event()

    def fetch_all(self, *args):
        rows = self.db.fetch_all(*args)
        self.read.set()
        self.proceed.wait(timeout=2.0)
        return rows


def test_an_upload_reusing_a_blob_a_collection_is_about_to_remove_keeps_its_bytes(db: Database, env) -> None:
    # The race the gc lock closes, made certain: a collection has read the references (the pruned
    # checkpoint's blob is garbage in them) and has not deleted yet; a new artifact with the same bytes
    # registers and the server finds the blob present. Without the lock it records the file verified and
    # the collection then deletes the blob under a complete artifact; with it, the server waits for the
    # collection, finds the blob gone and has it uploaded again.
    blob_dir = env["blob_dir"]
    db.fetch_one("UPDATE artifact_settings SET keep_checkpoints = 1 RETURNING 1")
    setup = make_member(db)
    shared = os.urandom(2 * CHUNK + 5)
    deliver(env, setup, "ckpt.1", {"w.bin": shared}, "checkpoint")
    deliver(env, setup, "ckpt.2", {"w.bin": os.urandom(10)}, "checkpoint")
    paused = PausedAfterReferences(db)
    collection = threading.Thread(target=collect, args=(paused, blob_dir), kwargs={"min_age": 0})
    collection.start()
    assert paused.read.wait(timeout=30)
    art = deliver(env, setup, "model", {"w.bin": shared})
    paused.proceed.set()
    collection.join(timeout=30)
    assert art["state"] == "complete"
    row = db.fetch_one("SELECT * FROM artifacts WHERE id = %s", (art["id"],))
    assert verify_stored(FsBlobStore(blob_dir), row).ok


def _staged(blob_dir: Path, artifact_id: int, age: float) -> Path:
    """A staged file of the artifact, as an interrupted upload leaves it, last written `age` seconds ago."""
    part = blob_dir / "staging" / "artifacts" / str(artifact_id) / "0123456789abcdef" / "0.part"
    part.parent.mkdir(parents=True, exist_ok=True)
    part.write_bytes(os.urandom(CHUNK))
    when = part.stat().st_mtime - age
    for path in (part, part.parent, part.parent.parent):
        os.utime(path, (when, when))
    return part.parent.parent


def test_gc_removes_what_ended_uploads_left_behind_never_an_uploading_ones(db: Database, env) -> None:
    from psycopg.types.json import Jsonb

    from tuneplane.workers.artifacts.manifest import build_manifest

    blob_dir, setup = env["blob_dir"], make_member(db)
    src = env["tmp"] / "src-staged"
    write_tree(src, {"w.bin": os.urandom(3 * CHUNK)})
    manifest = build_manifest(src)

    def registered(name: str) -> int:
        return db.call(
            "register_artifact", setup.credential_hash, setup.member["id"], name, "output", "object",
            Jsonb(manifest.as_json()), manifest.digest, None,
        )[0]["id"]  # fmt: skip

    uploading, failed_old, failed_new = registered("up"), registered("gone"), registered("just-failed")
    for artifact_id in (failed_old, failed_new):
        db.call("fail_artifact", setup.credential_hash, artifact_id, "the agent gave up")
    kept_uploading = _staged(blob_dir, uploading, age=7200)  # old, but its upload may resume any time
    removed = _staged(blob_dir, failed_old, age=7200)
    kept_recent = _staged(blob_dir, failed_new, age=10)
    (blob_dir / "tmp").mkdir(exist_ok=True)
    stale_tmp, fresh_tmp = blob_dir / "tmp" / "upload-stale", blob_dir / "tmp" / "upload-fresh"
    for path, age in ((stale_tmp, 7200), (fresh_tmp, 10)):
        path.write_bytes(b"x" * 100)
        os.utime(path, (path.stat().st_mtime - age, path.stat().st_mtime - age))

    dry = collect(db, blob_dir, min_age=3600, dry_run=True)
    assert (dry.removed_leftovers, dry.leftover_bytes) == (2, CHUNK + 100) and removed.exists()
    report = collect(db, blob_dir, min_age=3600)
    assert (report.removed_leftovers, report.leftover_bytes) == (2, CHUNK + 100)
    assert not removed.exists() and not stale_tmp.exists()
    assert kept_uploading.exists() and kept_recent.exists() and fresh_tmp.exists()


def test_gc_against_a_database_without_the_schema_says_which_option_names_the_installation(
    empty_db_url: str, tmp_path: Path
) -> None:
    """`tuneplane blobs gc` without `--data-dir` (walking issue 32 after `tuneplane up --data-dir DIR`) met a
    database with no schema and said "unexpected InvalidSchemaName …"; it now says what to pass."""
    from click.testing import CliRunner

    from tuneplane.app.cli import main

    run = CliRunner().invoke(
        main, ["blobs", "gc", "--dry-run", "--database-url", empty_db_url, "--data-dir", str(tmp_path)]
    )
    assert run.exit_code == 1, run.output
    assert "holds no TunePlane schema" in run.output and "--data-dir" in run.output
    assert "unexpected" not in run.output and "Traceback" not in run.output
