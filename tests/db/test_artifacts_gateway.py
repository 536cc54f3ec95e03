"""Agent-side artifact work through the node gateway's artifact routes (aiohttp on loopback): delivering
outputs, and materializing a later job's pinned inputs with verification before PREPARED."""

from __future__ import annotations

import asyncio
import hashlib
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest
from aiohttp import web

from tests.artifact_fixtures import make_member, write_tree
from tests.launch_fixtures import members_of
from tuneplane.app.artifacts.gateway_routes import add_artifact_routes
from tuneplane.app.db import Database
from tuneplane.app.submission import service
from tuneplane.workers.artifacts.deliver import deliver_artifact, node_http
from tuneplane.workers.artifacts.materialize import MaterializeError, materialize_inputs


@contextmanager
def serve_gateway_routes(db_url: str, blob_dir: Path, port: int) -> Iterator[str]:
    loop = asyncio.new_event_loop()
    app = web.Application(client_max_size=16 * 1024 * 1024)
    add_artifact_routes(app, db_url, blob_dir)
    runner = web.AppRunner(app)
    loop.run_until_complete(runner.setup())
    loop.run_until_complete(web.TCPSite(runner, "127.0.0.1", port).start())
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(timeout=10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=5)
        if not thread.is_alive():
            loop.close()


@pytest.fixture
def gw(db: Database, db_url: str, tmp_path: Path, port: int):
    db.fetch_one("UPDATE artifact_settings SET chunk_size = 4096 RETURNING chunk_size")
    with serve_gateway_routes(db_url, tmp_path / "blobs", port) as url:
        yield {"url": url, "blob_dir": tmp_path / "blobs", "tmp": tmp_path}


def consuming_job(db: Database, setup, ref: str) -> dict:
    """A second job of the same user whose preview pins the artifact, placed on the same node."""
    preview = service.create_preview(
        db,
        setup.user_id,
        {"recipe": {"name": "demo"}, "fleet": "gpu", "inputs": [{"name": "base", "artifact": ref}]},
    )
    receipt = service.confirm(db, setup.user_id, preview["id"], preview["digest"], "consume-1")
    db.call("reserve_next", setup.fleet_id, 1000)
    job = db.fetch_one("SELECT * FROM jobs WHERE id = %s", (receipt["job_id"],))
    assert members_of(db, job["id"])[0]["node_id"] == setup.node_id
    return job


def test_a_checkpoint_delivered_through_the_gateway_is_materialized_and_verified_for_the_next_job(
    db: Database, gw
) -> None:
    setup = make_member(db)
    src = gw["tmp"] / "out"
    files = {"weights.bin": os.urandom(20_000), "tokenizer/vocab.txt": b"a\nb\n", "empty": b""}
    write_tree(src, files)
    with node_http(gw["url"], setup.credential) as http:
        art = deliver_artifact(http, setup.member["id"], "checkpoint", src, kind="checkpoint")
        assert art["state"] == "complete", art
        job = consuming_job(db, setup, f"{setup.job_id}/checkpoint")
        pinned = job["spec"]["inputs"]
        assert pinned[0]["manifest_digest"] == art["manifest_digest"]
        done = materialize_inputs(http, pinned, gw["tmp"] / "inputs")
        assert done["base"]["files"] == 3
        for rel, data in files.items():
            assert (gw["tmp"] / "inputs" / "base" / rel).read_bytes() == data
        # A second PREPARE finds the verified copy and changes nothing.
        assert materialize_inputs(http, pinned, gw["tmp"] / "inputs")["base"]["files"] == 3

        # A pin that does not match the manifest the server sends is refused.
        forged = [{**pinned[0], "manifest_digest": "0" * 64}]
        with pytest.raises(MaterializeError, match="refusing it"):
            materialize_inputs(http, forged, gw["tmp"] / "forged")

        # Damaged bytes in the store never reach the member: the input is refused naming the file.
        sha = hashlib.sha256(files["tokenizer/vocab.txt"]).hexdigest()
        (gw["blob_dir"] / "sha256" / sha[:2] / sha).write_bytes(b"a\nB\n")
        with pytest.raises(MaterializeError, match=r"tokenizer/vocab\.txt"):
            materialize_inputs(http, pinned, gw["tmp"] / "inputs2")


def test_a_node_without_a_consuming_member_cannot_read_an_artifact(db: Database, gw) -> None:
    setup = make_member(db)
    src = gw["tmp"] / "out"
    write_tree(src, {"a.bin": b"secret"})
    with node_http(gw["url"], setup.credential) as http:
        art = deliver_artifact(http, setup.member["id"], "model", src)
        response = http.get(f"/api/input-artifacts/{art['id']}")
    assert response.status_code == 404


def test_a_chunk_larger_than_the_gateways_message_limit_is_accepted(db: Database, gw) -> None:
    # The gateway bounds control messages at 16 MiB (client_max_size); artifact chunks are bounded by the
    # stored chunk size instead (up to 256 MiB), so a 20 MiB chunk goes through in one request.
    db.fetch_one("UPDATE artifact_settings SET chunk_size = %s RETURNING chunk_size", (20 * 1024 * 1024,))
    setup = make_member(db)
    src = gw["tmp"] / "big"
    write_tree(src, {"weights.bin": os.urandom(20 * 1024 * 1024 + 5)})
    with node_http(gw["url"], setup.credential) as http:
        result = deliver_artifact(http, setup.member["id"], "big", src)
    assert result["state"] == "complete" and result["chunks_sent"] == 2


@pytest.mark.parametrize(
    ("path", "body", "field"),
    [
        ("/api/artifacts", b"not json", "body"),
        ("/api/artifacts", b"[1]", "body"),
        ("/api/artifacts", b'{"name": "m", "manifest": {}, "manifest_digest": "d"}', "member_id"),
        (
            "/api/artifacts",
            b'{"member_id": "7", "name": "m", "manifest": {}, "manifest_digest": "d"}',
            "member_id",
        ),
        (
            "/api/artifacts",
            b'{"member_id": true, "name": "m", "manifest": {}, "manifest_digest": "d"}',
            "member_id",
        ),
        (
            "/api/artifacts",
            b'{"member_id": 7, "name": "m", "manifest": [], "manifest_digest": "d"}',
            "manifest",
        ),
        ("/api/artifacts", b'{"member_id": 7, "name": 5, "manifest": {}, "manifest_digest": "d"}', "name"),
        (
            "/api/artifacts",
            b'{"member_id": 7, "name": "m", "manifest": {}, "manifest_digest": "d", "inline": ["a"]}',
            "inline",
        ),
        (
            "/api/artifacts",
            b'{"member_id": 7, "name": "m", "manifest": {}, "manifest_digest": "d", "inline": {"a": "!?"}}',
            "inline",
        ),
        ("/api/artifacts/1/fail", b"[1]", "body"),
        ("/api/artifacts/1/fail", b'{"reason": {"a": 1}}', "reason"),
    ],
)
def test_malformed_agent_requests_name_the_field_on_the_server_and_the_gateway(
    db: Database, db_url: str, gw, tmp_path: Path, path: str, body: bytes, field: str
) -> None:
    # Both front doors refuse the same way (one validation, app.artifacts.receiver); before, a JSON array
    # sent to the gateway's /fail was a 500.
    from tests.artifact_fixtures import served_artifacts
    from tests.conftest import free_port

    setup = make_member(db)
    headers = {"Authorization": f"Node {setup.credential}", "Content-Type": "application/json"}
    with served_artifacts(db, db_url, tmp_path / "server", free_port(), 4096) as server:
        for base in (gw["url"], server["url"]):
            answer = httpx.post(base + path, content=body, headers=headers, timeout=30)
            assert answer.status_code == 400, (base, answer.text)
            assert field in answer.json()["fields"], (base, answer.json())


HUGE = "9" * 20  # past bigint


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        ("GET", f"/api/artifacts/{HUGE}/upload", None),
        ("POST", f"/api/artifacts/{HUGE}/finish", b"{}"),
        ("POST", f"/api/artifacts/{HUGE}/fail", b'{"reason": "x"}'),
        ("PUT", f"/api/artifacts/1/files/{HUGE}/chunks/0", b"abc"),
        ("PUT", "/api/artifacts/1/files/0/chunks/99999999999", b"abc"),
        ("GET", f"/api/input-artifacts/{HUGE}", None),
        ("GET", f"/api/input-artifacts/1/files/{HUGE}", None),
        (
            "POST",
            "/api/artifacts",
            b'{"member_id": 1180591620717411303424, "name": "m", "manifest": {}, "manifest_digest": "d"}',
        ),
    ],
)
def test_out_of_range_ids_are_a_4xx_on_the_server_and_the_gateway(
    db: Database, db_url: str, gw, tmp_path: Path, method: str, path: str, body: bytes | None
) -> None:
    from tests.artifact_fixtures import served_artifacts
    from tests.conftest import free_port

    setup = make_member(db)
    headers = {"Authorization": f"Node {setup.credential}", "Content-Type": "application/json",
               "X-Chunk-Crc32c": "00000000"}  # fmt: skip
    with served_artifacts(db, db_url, tmp_path / "server", free_port(), 4096) as server:
        for base in (gw["url"], server["url"]):
            answer = httpx.request(method, base + path, content=body, headers=headers, timeout=30)
            assert 400 <= answer.status_code < 500, (base, answer.status_code, answer.text)
