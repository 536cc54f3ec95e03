"""The node's other senders honour 503 + Retry-After (the server's database away: a failover, issue 33): the
collector's shipper to the telemetry gateway and the artifact upload transport to the node gateway wait
the pause the server asks for, not their own (much shorter) backoff. A real HTTP server on loopback that
answers 503 with `Retry-After: 1` once, then 200 (tests/stub_503_server.py)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.stub_503_server import Stub503Server, stub_503_server
from tuneplane.workers.artifacts.upload import HttpChunkTransport
from tuneplane.workers.collector.shipper import Shipper
from tuneplane.workers.collector.spool import Spool

ASKED_S = 1


@pytest.fixture
def server() -> Iterator[Stub503Server]:
    with stub_503_server(1, str(ASKED_S)) as srv:
        yield srv


def _waited(srv: Stub503Server) -> float:
    assert len(srv.seen) == 2, srv.seen
    return srv.seen[1][1] - srv.seen[0][1]


def test_the_collector_waits_the_pause_a_503_asks_for(server: Stub503Server, tmp_path: Path) -> None:
    spool = Spool(tmp_path, fsync_interval=0).open()
    spool.append(b"batch", {})
    shipper = Shipper(spool, server.url, "tok", max_backoff=0.05, parallel=1)
    shipper.start()
    try:
        deadline = time.monotonic() + 30
        while shipper.stats.sent < 1:
            assert time.monotonic() < deadline, shipper.stats
            time.sleep(0.02)
    finally:
        shipper.stop()
        shipper.join(10)
    assert _waited(server) >= ASKED_S  # its own backoff would have tried again within 0.05 s


def test_an_artifact_upload_call_waits_the_pause_a_503_asks_for(server: Stub503Server) -> None:
    with httpx.Client(base_url=server.url) as http:
        transport = HttpChunkTransport(http, 7, retries=2, backoff=0.01)
        assert transport.status() == {}
    assert _waited(server) >= ASKED_S  # its own backoff: 0.01 s


def test_an_input_download_waits_the_pause_a_503_asks_for(tmp_path: Path) -> None:
    """A prepare materializing an input or a resume checkpoint during a failover: the manifest and each
    file are asked again after the pause, not failed at once (the prepare would fail and the launch abort)."""
    import hashlib
    import json

    from tuneplane.workers.artifacts.manifest import build_manifest
    from tuneplane.workers.artifacts.materialize import _download, fetch_manifest

    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "w.bin").write_bytes(b"weights")
    manifest = build_manifest(tmp_path / "src")
    pinned = {"artifact_id": 7, "name": "ckpt", "manifest_digest": manifest.digest}
    with stub_503_server(1, str(ASKED_S), json.dumps({"manifest": manifest.as_json()}).encode()) as srv:
        with httpx.Client(base_url=srv.url) as http:
            assert fetch_manifest(http, pinned).digest == manifest.digest
        assert _waited(srv) >= ASKED_S
    body = b"the file's bytes"
    with stub_503_server(1, str(ASKED_S), body) as srv:
        with httpx.Client(base_url=srv.url) as http:
            _download(http, 7, 0, hashlib.sha256(body).hexdigest(), tmp_path / "out" / "w.bin")
        assert _waited(srv) >= ASKED_S
    assert (tmp_path / "out" / "w.bin").read_bytes() == body
