"""The server hashes a file while its chunks arrive in order (app/artifacts/staged_hash.py) and then does
not read it back; anything that breaks the order or touches the staged bytes falls back to reading back.
Real HTTP on loopback: the console server (waitress) and the node gateway's routes (aiohttp), in threads
of this process so the receiver's debug log ("N bytes hashed on arrival, M read back") is visible."""

from __future__ import annotations

import logging
import os
import re
import socket
from pathlib import Path

import google_crc32c
import pytest

from tests.artifact_fixtures import make_member, served_artifacts, write_tree
from tests.db.test_artifacts_gateway import serve_gateway_routes
from tuneplane.app.db import Database
from tuneplane.workers.artifacts.deliver import deliver_artifact, node_http, register
from tuneplane.workers.artifacts.upload import (
    Chunk,
    HttpChunkTransport,
    UploadError,
    read_chunk,
    upload_artifact,
)

CHUNK = 4096


@pytest.fixture(params=["server", "gateway"])
def target(request, db: Database, db_url: str, tmp_path: Path, port: int):
    """{"url", "blob_dir", "tmp"}: the console server or the node gateway, both with 4 KiB chunks."""
    if request.param == "server":
        with served_artifacts(db, db_url, tmp_path, port, CHUNK) as served:
            yield served
        return
    db.fetch_one("UPDATE artifact_settings SET chunk_size = %s RETURNING chunk_size", (CHUNK,))
    with serve_gateway_routes(db_url, tmp_path / "blobs", port) as url:
        yield {"url": url, "blob_dir": tmp_path / "blobs", "tmp": tmp_path}


@pytest.fixture
def assembled(caplog):
    """{path: (bytes hashed on arrival, bytes read back)} from the receiver's log."""
    caplog.set_level(logging.DEBUG, logger="tuneplane.app.artifacts.receiver")

    def read() -> dict[str, tuple[int, int]]:
        found = {}
        for record in caplog.records:
            match = re.match(
                r"(.+): assembled, (\d+) bytes hashed on arrival, (\d+) read back", record.getMessage()
            )
            if match:
                found[match[1]] = (int(match[2]), int(match[3]))
        return found

    return read


def send(transport: HttpChunkTransport, src: Path, path: str, index: int, size: int) -> dict:
    chunk = Chunk(index, index * CHUNK, min(CHUNK, size - index * CHUNK))
    data, crc = read_chunk(src / path, chunk)
    return transport.put_chunk(0, index, data, crc)


def test_files_sent_in_order_are_proven_as_they_arrive_and_not_read_back(
    db: Database, target, assembled
) -> None:
    setup = make_member(db)
    src = target["tmp"] / "out"
    files = {"a.bin": os.urandom(5 * CHUNK + 7), "b.bin": os.urandom(3 * CHUNK), "c/d.bin": os.urandom(CHUNK)}
    write_tree(src, files)
    with node_http(target["url"], setup.credential) as http:
        art = deliver_artifact(http, setup.member["id"], "model", src, inline_max_bytes=0)
    assert art["state"] == "complete", art
    assert assembled() == {path: (len(data), 0) for path, data in files.items()}
    assert not (target["blob_dir"] / "staging" / "artifacts" / str(art["id"])).exists()


def test_chunks_out_of_order_are_read_back_from_where_the_order_broke(
    db: Database, target, assembled
) -> None:
    setup = make_member(db)
    src = target["tmp"] / "out"
    size = 4 * CHUNK + 100
    manifest = write_tree(src, {"a.bin": os.urandom(size)})
    with node_http(target["url"], setup.credential) as http:
        transport = HttpChunkTransport(http, register(http, setup.member["id"], "a", manifest)["id"])
        for index in (0, 3, 1, 4):
            assert send(transport, src, "a.bin", index, size)["file_verified"] is False
        # Chunk 2 closes the gap: 0-2 arrived in order (proven), 3 and 4 are read back and checked.
        assert send(transport, src, "a.bin", 2, size) == {"file_verified": True, "state": "complete"}
    assert assembled() == {"a.bin": (3 * CHUNK, CHUNK + 100)}


def test_a_resent_chunk_inside_the_proven_part_voids_the_proof(db: Database, target, assembled) -> None:
    """A chunk sent again with other bytes (the file changed) over bytes already proven: the server must
    not trust the sha256 it computed over the first bytes; reading back finds the file does not match."""
    setup = make_member(db)
    src = target["tmp"] / "out"
    size = 3 * CHUNK
    original = os.urandom(size)
    manifest = write_tree(src, {"a.bin": original})
    with node_http(target["url"], setup.credential) as http:
        transport = HttpChunkTransport(http, register(http, setup.member["id"], "a", manifest)["id"])
        send(transport, src, "a.bin", 0, size)
        send(transport, src, "a.bin", 1, size)
        (src / "a.bin").write_bytes(os.urandom(CHUNK) + original[CHUNK:])
        send(transport, src, "a.bin", 0, size)
        with pytest.raises(UploadError, match="do not match the manifest"):
            send(transport, src, "a.bin", 2, size)
    assert assembled() == {"a.bin": (0, size)}


def test_the_same_chunk_sent_again_is_read_back_and_completes(db: Database, target, assembled) -> None:
    setup = make_member(db)
    src = target["tmp"] / "out"
    size = 3 * CHUNK
    manifest = write_tree(src, {"a.bin": os.urandom(size)})
    with node_http(target["url"], setup.credential) as http:
        transport = HttpChunkTransport(http, register(http, setup.member["id"], "a", manifest)["id"])
        for index in (0, 1, 1, 2):
            answer = send(transport, src, "a.bin", index, size)
    assert answer == {"file_verified": True, "state": "complete"}
    assert assembled() == {"a.bin": (0, size)}


def test_a_body_cut_short_is_refused_and_the_chunk_is_not_held(db: Database, target) -> None:
    setup = make_member(db)
    src = target["tmp"] / "out"
    manifest = write_tree(src, {"a.bin": os.urandom(2 * CHUNK)})
    with node_http(target["url"], setup.credential) as http:
        art = register(http, setup.member["id"], "a", manifest)
        data = (src / "a.bin").read_bytes()[:CHUNK]
        host, port = target["url"].removeprefix("http://").split(":")
        with socket.create_connection((host, int(port)), timeout=30) as sock:
            sock.sendall(
                f"PUT /api/artifacts/{art['id']}/files/0/chunks/0 HTTP/1.1\r\nHost: {host}\r\n"
                f"Authorization: Node {setup.credential}\r\nContent-Length: {CHUNK}\r\n"
                f"X-Chunk-Crc32c: {google_crc32c.value(data):08x}\r\n\r\n".encode()
                + data[: CHUNK // 2]
            )
            sock.shutdown(socket.SHUT_WR)
            sock.settimeout(30)
            while sock.recv(65536):
                pass
        status = HttpChunkTransport(http, art["id"]).status()
        assert status["files"][0]["chunks"] in ([], None)
        assert upload_artifact(src, manifest, HttpChunkTransport(http, art["id"])).state == "complete"


def test_a_refused_chunk_gets_its_reason_though_its_large_body_was_never_read(
    db: Database, db_url: str, tmp_path: Path, port: int
) -> None:
    """The gateway asks the database before reading a body; a refusal answers while the agent is still
    sending 8 MiB, and the agent gets the reason, not a broken connection."""
    chunk = 8 * 1024 * 1024
    db.fetch_one("UPDATE artifact_settings SET chunk_size = %s RETURNING chunk_size", (chunk,))
    setup = make_member(db)
    manifest = write_tree(tmp_path / "out", {"a.bin": os.urandom(chunk)})
    with (
        serve_gateway_routes(db_url, tmp_path / "blobs", port) as url,
        node_http(url, setup.credential) as http,
    ):
        transport = HttpChunkTransport(http, register(http, setup.member["id"], "a", manifest)["id"])
        big = [os.urandom(1024 * 1024) for _ in range(8)]
        crc = f"{google_crc32c.value(b''.join(big)):08x}"
        with pytest.raises(UploadError, match="chunk 3 is outside the file") as refused:
            transport.put_chunk(0, 3, big, crc)
        assert refused.value.status == 400
        # The connection is still usable and the real chunk goes in.
        data, crc = read_chunk(tmp_path / "out" / "a.bin", Chunk(0, 0, chunk))
        assert transport.put_chunk(0, 0, data, crc) == {"file_verified": True, "state": "complete"}


def test_a_body_that_stalls_is_refused_and_frees_its_thread(
    db: Database, db_url: str, tmp_path: Path, port: int, monkeypatch
) -> None:
    from tuneplane.app.artifacts import gateway_routes

    monkeypatch.setattr(gateway_routes, "BODY_STALL_SECONDS", 0.5)
    db.fetch_one("UPDATE artifact_settings SET chunk_size = %s RETURNING chunk_size", (CHUNK,))
    setup = make_member(db)
    manifest = write_tree(tmp_path / "out", {"a.bin": os.urandom(CHUNK)})
    with (
        serve_gateway_routes(db_url, tmp_path / "blobs", port) as url,
        node_http(url, setup.credential) as http,
    ):
        art = register(http, setup.member["id"], "a", manifest)
        with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
            sock.sendall(
                f"PUT /api/artifacts/{art['id']}/files/0/chunks/0 HTTP/1.1\r\nHost: x\r\n"
                f"Authorization: Node {setup.credential}\r\nContent-Length: {CHUNK}\r\n"
                f"X-Chunk-Crc32c: 00000000\r\n\r\n".encode()
                + b"x" * 100
            )
            answer = sock.recv(65536)  # the connection stays open: only the stall ends the wait
        assert answer.startswith(b"HTTP/1.1 400") and b"the chunk body ended after" in answer
        assert (
            upload_artifact(tmp_path / "out", manifest, HttpChunkTransport(http, art["id"])).state
            == "complete"
        )
