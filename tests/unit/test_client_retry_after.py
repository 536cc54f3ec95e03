"""The CLI's client waits out a 503 with Retry-After for a read (the database failing over, issue 33) and
never sends a write twice. A real HTTP server on loopback (tests/stub_503_server.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.stub_503_server import Stub503Server, stub_503_server
from tuneplane.app.client.config import ClientConfig
from tuneplane.app.client.http import ApiClient, ClientError


@pytest.fixture
def server() -> Iterator[Stub503Server]:
    with stub_503_server(2, "0", b'{"ok": true}') as srv:
        yield srv


def _client(srv: Stub503Server) -> ApiClient:
    return ApiClient(ClientConfig(srv.url, "tok"))


def test_a_read_waits_out_503_retry_after(server: Stub503Server) -> None:
    with _client(server) as client:
        assert client.get("/api/jobs") == {"ok": True}
    assert [method for method, _t in server.seen] == ["GET", "GET", "GET"]


def test_a_write_is_not_sent_twice(server: Stub503Server) -> None:
    with _client(server) as client, pytest.raises(ClientError) as failed:
        client.post("/api/jobs", json={})
    assert failed.value.status == 503 and [method for method, _t in server.seen] == ["POST"]
