"""Downloads of an S3 fleet's artifacts (issue 32, item 4): a node materializes a pinned input (the same path
as a resume checkpoint) with presigned GETs straight from a real SeaweedFS, verified against the manifest;
the server's blob directory is never read or written; a URL is bound to one object; a byte flipped in the
store is found by the node and confirmed by the server's own re-read, which marks the artifact corrupt
(never resumed from), while a node's false report marks nothing; users' downloads stream from the store."""

from __future__ import annotations

import os
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest

from tests.artifact_fixtures import api_token, make_member, write_tree
from tests.db.test_artifacts_gateway import consuming_job, serve_gateway_routes
from tests.launch_fixtures import make_node
from tests.s3.test_s3_gateway import s3_fleet  # noqa: F401 - its fixture
from tests.seaweed_store import object_keys
from tuneplane.app import db_functions as fn
from tuneplane.app.db import Database
from tuneplane.app.web import create_app
from tuneplane.workers.artifacts.deliver import deliver_artifact, node_http
from tuneplane.workers.artifacts.materialize import MaterializeError, materialize_inputs

MiB = 1024 * 1024


def _no_files(root: Path) -> bool:
    return not root.exists() or not [p for p in root.rglob("*") if p.is_file()]


def _index(db: Database, artifact_id: int, path: str) -> int:
    return next(f["file_index"] for f in db.call(fn.artifact_file_list, artifact_id) if f["path"] == path)


def _corrupt(db: Database, artifact_id: int) -> dict | None:
    return db.fetch_one("SELECT * FROM artifact_corruptions WHERE artifact_id = %s", (artifact_id,))


@pytest.fixture
def delivered(db: Database, db_url: str, tmp_path: Path, port: int, s3_fleet):  # noqa: F811
    """A checkpoint delivered to the S3 fleet's store, a second job pinning it on the same node, and the
    node gateway's routes serving both (its blob directory: tmp_path/blobs)."""
    setup, store = s3_fleet
    files = {"weights.bin": os.urandom(6 * MiB + 5), "tok/vocab.txt": b"a\nb\n", "empty": b""}
    write_tree(tmp_path / "out", files)
    gateway = serve_gateway_routes(db_url, tmp_path / "blobs", port)
    with gateway as url, node_http(url, setup.credential) as http:
        art = deliver_artifact(http, setup.member["id"], "checkpoint", tmp_path / "out", kind="checkpoint")
        assert art["state"] == "complete", art
        job = consuming_job(db, setup, f"{setup.job_id}/checkpoint")
        yield {"setup": setup, "store": store, "http": http, "art": art, "files": files,
               "pinned": job["spec"]["inputs"], "tmp": tmp_path}  # fmt: skip


def test_a_node_materializes_an_s3_input_from_the_store_and_the_server_disk_stays_empty(
    db: Database, delivered
) -> None:
    d = delivered
    done = materialize_inputs(d["http"], d["pinned"], d["tmp"] / "inputs")
    assert done["base"]["files"] == 3
    for rel, data in d["files"].items():
        assert (d["tmp"] / "inputs" / "base" / rel).read_bytes() == data
    assert _no_files(d["tmp"] / "blobs")
    # The gateway answered with a redirect to the store: a GET of that one object, signed, short-lived.
    index = _index(db, d["art"]["id"], "weights.bin")
    answer = d["http"].get(f"/api/input-artifacts/{d['art']['id']}/files/{index}")
    assert answer.status_code == 307
    location = answer.headers["Location"]
    keys = object_keys(db, d["store"], d["art"]["id"])
    path = urlsplit(location).path
    assert location.startswith(d["store"].location.endpoint) and path.endswith("/" + keys["weights.bin"])
    assert "X-Amz-Expires=300" in location and "X-Amz-Signature=" in location
    # Bound to that key: the same signature for another object (the vocab's) is refused by the store.
    forged = location.replace(path, path.replace(keys["weights.bin"], keys["tok/vocab.txt"]))
    assert forged != location
    assert httpx.get(forged).status_code == 403
    assert httpx.get(location).content == d["files"]["weights.bin"]


def test_a_byte_flipped_in_the_store_is_confirmed_by_the_server_and_marks_the_checkpoint_corrupt(
    db: Database, delivered
) -> None:
    d = delivered
    store, art = d["store"], d["art"]
    # A node's false report (the object is intact) marks nothing: the server's own re-read decides.
    index = _index(db, art["id"], "weights.bin")
    lie = d["http"].post(f"/api/input-artifacts/{art['id']}/files/{index}/mismatch")
    assert lie.status_code == 200 and lie.json()["corrupt"] is False
    assert _corrupt(db, art["id"]) is None

    data = bytearray(d["files"]["weights.bin"])
    data[MiB] ^= 0x01
    store.put_bytes(object_keys(db, store, art["id"])["weights.bin"], bytes(data))
    with pytest.raises(MaterializeError, match=r"weights\.bin: .*marked the artifact corrupt"):
        materialize_inputs(d["http"], d["pinned"], d["tmp"] / "inputs")
    assert not (d["tmp"] / "inputs" / "base" / "weights.bin").exists()
    corrupt = _corrupt(db, art["id"])
    assert corrupt is not None and "re-reading the store" in corrupt["found_by"], corrupt
    assert _no_files(d["tmp"] / "blobs")


def test_a_node_without_a_consuming_member_gets_no_url(db: Database, delivered) -> None:
    d = delivered
    node = make_node(db, d["setup"].fleet_id, "other-node", gpus=2)
    other = make_member(db, user="bob", fleet="gpu", fleet_id=d["setup"].fleet_id, node_id=node)
    with node_http(str(d["http"].base_url), other.credential) as http:
        answer = http.get(f"/api/input-artifacts/{d['art']['id']}/files/0")
        report = http.post(f"/api/input-artifacts/{d['art']['id']}/files/0/mismatch")
    assert answer.status_code == 404 and "Location" not in answer.headers
    assert report.status_code == 404


def test_a_users_download_of_an_s3_artifact_streams_from_the_store(
    db: Database, db_url: str, delivered
) -> None:
    d = delivered
    app = create_app(db_url)
    app.config["TP_BLOB_DIR"] = str(d["tmp"] / "server-blobs")
    client = app.test_client()
    headers = {"Authorization": f"Bearer {api_token(db, d['setup'].user_id)}"}
    for entry in db.call(fn.artifact_file_list, d["art"]["id"]):
        url = f"/artifacts/{d['art']['id']}/files/{entry['file_index']}"
        for extra in ({}, {"X-Client-Verifies": "sha256"}):
            got = client.get(url, headers={**headers, **extra})
            assert got.status_code == 200, got.get_data(as_text=True)
            assert got.get_data() == d["files"][entry["path"]]
    assert _no_files(d["tmp"] / "server-blobs")
