"""The node's other senders honour 503 + Retry-After (the server's database away: a failover, issue 33): the
collector's shipper to the telemetry gateway and the artifact upload transport to the node gateway wait
the pause the server asks for, not their own (much shorter) backoff. A real HTTP server on loopback that
answers 503 with `Retry-After: 1` once, then 200."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest

from tuneplane.workers.artifacts.upload import HttpChunkTransport
from tuneplane.workers.collector.shipper import Shipper
from tuneplane.workers.collector.spool import Spool

ASKED_S = 1


class _Server(ThreadingHTTPServer):
    unavailable = 1
    seen: list[float]


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def _answer(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.server.seen.append(time.monotonic())
        if self.server.unavailable > 0:
            self.server.unavailable -= 1
            body = b'{"error": "the database is unavailable; try again shortly"}'
            self.send_response(503)
            self.send_header("Retry-After", str(ASKED_S))
        else:
            body = b"{}"
            self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = _answer

    def log_message(self, *_args: object) -> None:
        pass


@pytest.fixture
def server() -> Iterator[_Server]:
    srv = _Server(("127.0.0.1", 0), _Handler)
    srv.seen = []
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    try:
        yield srv
    finally:
        srv.shutdown()
        srv.server_close()


def _url(srv: _Server) -> str:
    return f"http://127.0.0.1:{srv.server_address[1]}"


def _waited(srv: _Server) -> float:
    assert len(srv.seen) == 2, srv.seen
    return srv.seen[1] - srv.seen[0]


def test_the_collector_waits_the_pause_a_503_asks_for(server: _Server, tmp_path: Path) -> None:
    spool = Spool(tmp_path, fsync_interval=0).open()
    spool.append(b"batch", {})
    shipper = Shipper(spool, _url(server), "tok", max_backoff=0.05, parallel=1)
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


def test_an_artifact_upload_call_waits_the_pause_a_503_asks_for(server: _Server) -> None:
    with httpx.Client(base_url=_url(server)) as http:
        transport = HttpChunkTransport(http, 7, retries=2, backoff=0.01)
        assert transport.status() == {}
    assert _waited(server) >= ASKED_S  # its own backoff: 0.01 s
