"""A loopback HTTP server that answers `503` with `Retry-After` a number of times, then 200: what a TunePlane
server sends while its database is away (a failover, issue 33). For the clients' Retry-After tests (the
CLI, the collector, the artifact upload calls); each request is recorded with its method and time."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class Stub503Server(ThreadingHTTPServer):
    unavailable: int  # answers before the database is "back"
    retry_after: str
    ok_body: bytes
    seen: list[tuple[str, float]]  # (method, time.monotonic()) of every request

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class _Handler(BaseHTTPRequestHandler):
    server: Stub503Server

    def _answer(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.server.seen.append((self.command, time.monotonic()))
        if self.server.unavailable > 0:
            self.server.unavailable -= 1
            body = b'{"error": "the database is unavailable; try again shortly"}'
            self.send_response(503)
            self.send_header("Retry-After", self.server.retry_after)
        else:
            body = self.server.ok_body
            self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = do_PUT = _answer

    def log_message(self, *_args: object) -> None:
        pass


@contextmanager
def stub_503_server(unavailable: int, retry_after: str, ok_body: bytes = b"{}") -> Iterator[Stub503Server]:
    srv = Stub503Server(("127.0.0.1", 0), _Handler)
    srv.unavailable, srv.retry_after, srv.ok_body, srv.seen = unavailable, retry_after, ok_body, []
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    try:
        yield srv
    finally:
        srv.shutdown()
        srv.server_close()
