"""Garbage collection in an S3 store (issue 32, lifecycle; app/artifacts/s3_gc.py) against a real SeaweedFS:
unreferenced blob and artifact objects go, referenced ones stay, open multipart uploads and objects of
artifacts no longer uploading are aborted or removed, an uploading artifact's upload is kept for its agent
to resume, and nothing younger than the minimum age is touched."""

from __future__ import annotations

import hashlib
import json
import os
import secrets
from pathlib import Path

import httpx
import pytest
from click.testing import CliRunner
from psycopg.types.json import Jsonb

from tests.artifact_fixtures import make_member, write_tree
from tests.seaweed_store import ACCESS_KEY, SECRET_KEY
from tuneplane.app import db_functions as fn
from tuneplane.app.artifacts.s3_gc import collect_fleet_stores, collect_s3, fleet_stores
from tuneplane.app.cli import main
from tuneplane.app.db import Database
from tuneplane.app.s3store import S3Credentials, S3Location, S3Store, part_checksum
from tuneplane.workers.sweeps import SweepContext, blob_gc


@pytest.fixture
def store(seaweed) -> S3Store:
    bucket = "gc-" + secrets.token_hex(6)
    seaweed.client().create_bucket(Bucket=bucket)
    location = S3Location(endpoint=seaweed.endpoint, bucket=bucket, prefix="fleet-a")
    return S3Store(location, S3Credentials(ACCESS_KEY, SECRET_KEY))


def _register(db: Database, setup, tmp_path: Path, name: str, data: bytes) -> dict:
    manifest = write_tree(tmp_path / name, {"w.bin": data})
    return db.call(
        fn.register_artifact, setup.credential_hash, setup.member["id"], name, "output", "object",
        Jsonb(manifest.as_json()), manifest.digest, None, None,
    )[0]  # fmt: skip


def _open_upload(store: S3Store, key: str) -> str:
    upload_id = store.create_multipart(key)
    part = os.urandom(1000)
    url = store.presign_part(key, upload_id, 1, part_checksum(part))
    assert httpx.put(url.url, content=part, headers=url.headers).status_code == 200
    return upload_id


def test_s3_gc_removes_garbage_and_aborts_uploads_of_ended_artifacts(
    db: Database, store: S3Store, tmp_path: Path
) -> None:
    setup = make_member(db)
    cred = setup.credential_hash
    uploading = _register(db, setup, tmp_path, "model", os.urandom(3000))
    ended = _register(db, setup, tmp_path, "other", os.urandom(2000))
    db.call(fn.fail_artifact, cred, ended["id"], "the agent gave up")
    done_bytes = os.urandom(1500)  # a complete artifact's file, verified in place at its own key
    done = _register(db, setup, tmp_path, "done", done_bytes)
    store.put_bytes(store.key(f"artifacts/{done['id']}/0"), done_bytes)
    digest = hashlib.sha256(done_bytes).hexdigest()
    assert db.call(fn.record_artifact_object, cred, done["id"], 0, digest, len(done_bytes),
                   f"artifacts/{done['id']}/0")[0]["state"] == "complete"  # fmt: skip
    blob_bytes = os.urandom(700)  # a content-addressed blob something needs (a source archive)
    blob = hashlib.sha256(blob_bytes).hexdigest()
    store.put_bytes(store.blob_key(blob), blob_bytes)
    db.call(fn.record_source_archive, setup.user_id, blob, 700, 1, 700)
    garbage = os.urandom(500)
    store.put_bytes(store.blob_key(hashlib.sha256(garbage).hexdigest()), garbage)
    resumable = _open_upload(store, store.key(f"artifacts/{uploading['id']}/0"))
    _open_upload(store, store.key(f"artifacts/{ended['id']}/0"))
    store.put_bytes(store.key(f"artifacts/{ended['id']}/1"), b"verified once, its artifact failed since")

    recent = collect_s3(db, store, min_age=3600)
    assert (recent.kept_recent, recent.removed, recent.aborted_uploads, recent.removed_objects) == (
        2, [], 0, 0,
    )  # fmt: skip
    dry = collect_s3(db, store, min_age=0, dry_run=True)
    assert (len(dry.removed), dry.aborted_uploads, dry.removed_objects) == (1, 1, 1)
    assert len(store.open_uploads("artifacts/")) == 2

    report = collect_s3(db, store, min_age=0)
    assert report.removed == [hashlib.sha256(garbage).hexdigest()] and report.kept_referenced == 2
    assert (report.aborted_uploads, report.removed_objects) == (1, 1)
    assert store.exists(blob) and not store.exists(hashlib.sha256(garbage).hexdigest())
    # The uploading artifact's upload stays open with its part, for its agent to resume; the complete
    # artifact's object stays where it was verified.
    assert [u["UploadId"] for u in store.open_uploads("artifacts/")] == [resumable]
    assert len(store.list_parts(store.key(f"artifacts/{uploading['id']}/0"), resumable)) == 1
    assert [o["Key"] for o in store.list_objects("artifacts/")] == [store.key(f"artifacts/{done['id']}/0")]

    # Once that artifact has ended too, the next collection leaves no multipart upload open.
    db.call(fn.fail_artifact, cred, uploading["id"], "member lost")
    assert collect_s3(db, store, min_age=0).aborted_uploads == 1
    assert store.open_uploads("artifacts/") == []


def test_fleet_stores_use_the_servers_credentials(
    db: Database, db_url: str, store: S3Store, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    setup = make_member(db)
    fleet = db.fetch_one("SELECT name FROM tuneplane.fleets WHERE id = %s", (setup.fleet_id,))["name"]
    loc = store.location
    storage = {"kind": "s3", "bucket": loc.bucket, "prefix": loc.prefix, "endpoint": loc.endpoint}
    db.call(fn.set_fleet_storage, fleet, Jsonb(storage), None)
    for name in (
        "TUNEPLANE_S3_ACCESS_KEY_ID",
        "TUNEPLANE_S3_SECRET_ACCESS_KEY",
        "TUNEPLANE_S3_CREDENTIALS_FILE",
    ):
        monkeypatch.delenv(name, raising=False)
    assert (
        collect_fleet_stores(db, min_age=0) == []
    )  # no credentials on this server: skipped, said in the log
    monkeypatch.setenv("TUNEPLANE_S3_ACCESS_KEY_ID", ACCESS_KEY)
    monkeypatch.setenv("TUNEPLANE_S3_SECRET_ACCESS_KEY", SECRET_KEY)
    assert [s.location.url for s in fleet_stores(db)] == [loc.url]
    garbage = os.urandom(100)
    store.put_bytes(store.blob_key(hashlib.sha256(garbage).hexdigest()), garbage)
    (report,) = collect_fleet_stores(db, min_age=0)
    assert report.store == loc.url and report.removed == [hashlib.sha256(garbage).hexdigest()]
    # The worker's six-hourly blob sweep collects the fleets' stores too.
    store.put_bytes(store.blob_key(hashlib.sha256(garbage).hexdigest()), garbage)
    said = blob_gc(SweepContext(db, tmp_path / "blobs", blob_gc_min_age=0))
    assert said is not None and f"blob gc {loc.url}: removed 1 object(s)" in said
    assert not store.exists(hashlib.sha256(garbage).hexdigest())
    # And `tuneplane blobs gc`, which says what it did in each store.
    store.put_bytes(store.blob_key(hashlib.sha256(garbage).hexdigest()), garbage)
    args = ["blobs", "gc", "--database-url", db_url, "--data-dir", str(tmp_path / "data"), "--min-age", "0"]
    result = CliRunner().invoke(main, [*args, "--json"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    (s3,) = json.loads(result.output)["s3"]
    assert s3["store"] == loc.url and s3["removed"] == 1 and s3["aborted_uploads"] == 0


def test_a_store_that_cannot_be_reached_does_not_stop_the_others(
    db: Database, db_url: str, store: S3Store, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Walking issue 32: one fleet named an endpoint nothing answers on, and `tuneplane blobs gc` ended in
    "unexpected EndpointConnectionError" without collecting the other fleets' stores (nor could the
    worker's sweep). Now each store is collected or named with why not, and the command exits 1."""
    from tests.conftest import free_port
    from tests.launch_fixtures import make_fleet

    setup = make_member(db)
    fleet = db.fetch_one("SELECT name FROM tuneplane.fleets WHERE id = %s", (setup.fleet_id,))["name"]
    loc = store.location
    storage = {"kind": "s3", "bucket": loc.bucket, "prefix": loc.prefix, "endpoint": loc.endpoint}
    db.call(fn.set_fleet_storage, fleet, Jsonb(storage), None)
    dead = {"kind": "s3", "bucket": "gone", "prefix": "", "endpoint": f"http://127.0.0.1:{free_port()}"}
    make_fleet(db, "dead")
    db.call(fn.set_fleet_storage, "dead", Jsonb(dead), None)
    monkeypatch.setenv("TUNEPLANE_S3_ACCESS_KEY_ID", ACCESS_KEY)
    monkeypatch.setenv("TUNEPLANE_S3_SECRET_ACCESS_KEY", SECRET_KEY)
    garbage = os.urandom(100)
    store.put_bytes(store.blob_key(hashlib.sha256(garbage).hexdigest()), garbage)

    reports = {r.store: r for r in collect_fleet_stores(db, min_age=0)}
    assert reports[loc.url].error is None and len(reports[loc.url].removed) == 1
    assert "EndpointConnectionError" in (reports["s3://gone"].error or "")

    store.put_bytes(store.blob_key(hashlib.sha256(garbage).hexdigest()), garbage)
    said = blob_gc(SweepContext(db, tmp_path / "blobs", blob_gc_min_age=0))
    assert said is not None and f"blob gc {loc.url}: removed 1 object(s)" in said
    assert "blob gc s3://gone: not collected" in said

    args = ["blobs", "gc", "--database-url", db_url, "--data-dir", str(tmp_path / "data"), "--min-age", "0"]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 1, result.output
    assert "s3://gone: not collected: EndpointConnectionError" in result.output
    assert "1 S3 store(s) not collected" in result.output and "unexpected" not in result.output
    assert f"{loc.url}: " in result.output  # the reachable one was collected and reported
