"""The agent's own delivery code (deliver_artifact over real HTTP) through the node gateway's artifact routes
to a fleet whose store is a real SeaweedFS: parts go straight to the store, the server verifies them, and
no byte lands in the server's blob directory; the node's requests carry no store keys."""

from __future__ import annotations

import os
import secrets
from pathlib import Path

import pytest
from psycopg.types.json import Jsonb

from tests.artifact_fixtures import make_member, write_tree
from tests.db.test_artifacts_gateway import serve_gateway_routes
from tests.seaweed_store import (
    ACCESS_KEY,
    BUCKET,
    SECRET_KEY,
    assert_stored_verified,
    object_keys,
    record_part_puts,
)
from tuneplane.app import db_functions as fn
from tuneplane.app.artifacts.s3_delivery import S3Delivery
from tuneplane.app.artifacts.s3_gc import collect_s3
from tuneplane.app.db import Database
from tuneplane.app.s3store import S3Credentials, S3Location, S3Store
from tuneplane.workers.artifacts.deliver import deliver_artifact, node_http
from tuneplane.workers.artifacts.s3_upload import upload_parts

MiB = 1024 * 1024


@pytest.fixture
def s3_fleet(db: Database, seaweed, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("TUNEPLANE_S3_ACCESS_KEY_ID", ACCESS_KEY)  # the gateway's (server's) environment
    monkeypatch.setenv("TUNEPLANE_S3_SECRET_ACCESS_KEY", SECRET_KEY)
    setup = make_member(db)
    prefix = f"gw/{secrets.token_hex(4)}"
    storage = {"kind": "s3", "bucket": BUCKET, "prefix": prefix, "endpoint": seaweed.endpoint}
    db.call("set_fleet_storage", "gpu", Jsonb(storage), "test")
    store = S3Store(S3Location(seaweed.endpoint, BUCKET, prefix), S3Credentials(ACCESS_KEY, SECRET_KEY))
    return setup, store


def test_agent_delivers_straight_to_the_store_and_the_server_disk_stays_empty(
    db: Database, db_url: str, tmp_path: Path, port: int, s3_fleet
) -> None:
    setup, store = s3_fleet
    files = {"weights.bin": os.urandom(12 * MiB + 3), "config.json": b'{"a": 1}', "empty": b""}
    write_tree(tmp_path / "out", files)
    gateway = serve_gateway_routes(db_url, tmp_path / "blobs", port)
    with gateway as url, node_http(url, setup.credential) as http:
        art = deliver_artifact(http, setup.member["id"], "checkpoint", tmp_path / "out", kind="checkpoint")
        assert art["state"] == "complete", art
        # A small artifact too: its inline bytes are not kept by the server for an S3 fleet.
        files["small/log.txt"] = os.urandom(1000)
        write_tree(tmp_path / "small", {"log.txt": files["small/log.txt"]})
        small = deliver_artifact(http, setup.member["id"], "logs", tmp_path / "small")
        assert small["state"] == "complete"
    blobs = tmp_path / "blobs"
    assert not blobs.exists() or not [p for p in blobs.rglob("*") if p.is_file()]
    assert_stored_verified(db, store, art["id"])
    assert_stored_verified(db, store, small["id"])


def test_bytes_the_store_holds_are_not_sent_again_and_stay_while_needed(
    db: Database, db_url: str, tmp_path: Path, port: int, s3_fleet, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Dedup without a copy: a file whose bytes a complete artifact in the same store holds is recorded at
    that artifact's object (no part sent); pruning the first artifact and collecting keep that object
    (the second needs it) and remove the first's other objects."""
    setup, store = s3_fleet
    db.fetch_one("UPDATE artifact_settings SET keep_checkpoints = 1 RETURNING 1")
    weights = os.urandom(6 * MiB + 1)
    write_tree(tmp_path / "one", {"weights.bin": weights, "state.json": b'{"step": 1}'})
    write_tree(tmp_path / "two", {"weights.bin": weights, "state.json": b'{"step": 2}'})
    sent = record_part_puts(monkeypatch)
    gateway = serve_gateway_routes(db_url, tmp_path / "blobs", port)
    with gateway as url, node_http(url, setup.credential) as http:
        one = deliver_artifact(http, setup.member["id"], "ckpt-1", tmp_path / "one", kind="checkpoint")
        assert one["state"] == "complete" and len(sent) == 2
        two = deliver_artifact(http, setup.member["id"], "ckpt-2", tmp_path / "two", kind="checkpoint")
    assert two["state"] == "complete" and len(sent) == 3  # state.json only: the weights were not sent
    keys_one, keys_two = object_keys(db, store, one["id"]), object_keys(db, store, two["id"])
    assert keys_two["weights.bin"] == keys_one["weights.bin"]
    assert db.fetch_one("SELECT state FROM artifacts WHERE id = %s", (one["id"],))["state"] == "pruned"
    report = collect_s3(db, store, min_age=0)
    assert report.removed_objects == 1 and store.object_size(keys_one["state.json"]) is None
    assert_stored_verified(db, store, two["id"])


def test_an_upload_left_open_by_an_earlier_manifest_is_begun_afresh(
    db: Database, db_url: str, tmp_path: Path, port: int, s3_fleet, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The agent was killed after a part, the output rewritten (same size, other bytes), the artifact
    registered again: the open upload holds a part of the right size but not these bytes (its ETag is not
    their MD5), so the agent begins it afresh instead of completing the stale part into the object."""
    setup, store = s3_fleet
    cred = setup.credential_hash
    old = write_tree(tmp_path / "v1", {"w.bin": os.urandom(MiB)})
    art = db.call(fn.register_artifact, cred, setup.member["id"], "ckpt", "checkpoint", "object",
                  Jsonb(old.as_json()), old.digest, None, None)[0]  # fmt: skip
    stale = S3Delivery(db, store)
    plan = stale.begin(cred, art["id"], 0)
    upload_parts(tmp_path / "v1" / "w.bin", plan,
                 lambda parts: stale.presign(cred, art["id"], 0, plan["upload_id"], parts))  # fmt: skip
    db.call(fn.fail_artifact, cred, art["id"], "the agent was killed")
    write_tree(tmp_path / "v2", {"w.bin": os.urandom(MiB)})
    sent = record_part_puts(monkeypatch)
    gateway = serve_gateway_routes(db_url, tmp_path / "blobs", port)
    with gateway as url, node_http(url, setup.credential) as http:
        done = deliver_artifact(http, setup.member["id"], "ckpt", tmp_path / "v2", kind="checkpoint")
    assert done["state"] == "complete" and done["id"] == art["id"] and len(sent) == 1, done
    assert_stored_verified(db, store, art["id"])


def test_a_fleet_store_without_server_credentials_is_a_503(
    db: Database, db_url: str, tmp_path: Path, port: int, s3_fleet, monkeypatch: pytest.MonkeyPatch
) -> None:
    setup, store = s3_fleet
    monkeypatch.delenv("TUNEPLANE_S3_ACCESS_KEY_ID")
    write_tree(tmp_path / "out", {"w.bin": os.urandom(MiB)})
    gateway = serve_gateway_routes(db_url, tmp_path / "blobs", port)
    with gateway as url, node_http(url, setup.credential) as http:
        art = deliver_artifact(http, setup.member["id"], "o", tmp_path / "out", inline_max_bytes=0)
    # The artifact stays uploading (the agent tries again later), with the reason; nothing was signed.
    assert art["state"] == "uploading" and "HTTP 503" in art["reason"], art
    assert store.open_uploads() == []
