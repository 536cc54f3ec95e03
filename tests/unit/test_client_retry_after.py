"""The CLI's client waits out a 503 with Retry-After for a read (the database failing over, issue 33) and
never sends a write twice. A real HTTP server on loopback."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from tuneplane.app.client.config import ClientConfig
from tuneplane.app.client.http import ApiClient, ClientError


class _Server(ThreadingHTTPServer):
    unavailable = 2  # answers before the database is "back"
    seen: list[str]


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def _answer(self) -> None:
        self.server.seen.append(self.command)
        if self.server.unavailable > 0:
            self.server.unavailable -= 1
            body = b'{"error": "the database is unavailable; try again shortly"}'
            self.send_response(503)
            self.send_header("Retry-After", "0")
        else:
            body = b'{"ok": true}'
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


def _client(srv: _Server) -> ApiClient:
    return ApiClient(ClientConfig(f"http://127.0.0.1:{srv.server_address[1]}", "tok"))


def test_a_read_waits_out_503_retry_after(server: _Server) -> None:
    with _client(server) as client:
        assert client.get("/api/jobs") == {"ok": True}
    assert server.seen == ["GET", "GET", "GET"]


def test_a_write_is_not_sent_twice(server: _Server) -> None:
    with _client(server) as client, pytest.raises(ClientError) as failed:
        client.post("/api/jobs", json={})
    assert failed.value.status == 503 and server.seen == ["POST"]
