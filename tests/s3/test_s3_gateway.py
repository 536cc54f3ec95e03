"""The agent's own delivery code (deliver_artifact over real HTTP) through the node gateway's artifact routes
to a fleet whose store is a real SeaweedFS: parts go straight to the store, the server verifies them, and
no byte lands in the server's blob directory; the node's requests carry no store keys."""

from __future__ import annotations

import hashlib
import os
import secrets
from pathlib import Path

import pytest
from psycopg.types.json import Jsonb

from tests.artifact_fixtures import make_member, write_tree
from tests.db.test_artifacts_gateway import serve_gateway_routes
from tests.seaweed_store import ACCESS_KEY, BUCKET, SECRET_KEY
from tuneplane.app.db import Database
from tuneplane.app.s3store import S3Credentials, S3Location, S3Store
from tuneplane.workers.artifacts.deliver import deliver_artifact, node_http

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
    for name, data in files.items():
        if data:
            digest = hashlib.sha256(data).hexdigest()
            assert store.verify(store.blob_key(digest), digest, len(data)), name
    assert store.open_uploads() == [] and list(store.list_keys("uploads/")) == []


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
