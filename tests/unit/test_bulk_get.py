"""app/client/bulk_get.py against a real loopback socket: the body arrives whole or the read fails."""

from __future__ import annotations

import socket
import ssl
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from tests.e2e.test_node_agents import _test_pki
from tuneplane.app.client.bulk_get import BulkGetError, bulk_get, proxied


@contextmanager
def one_answer(raw: bytes, tls: ssl.SSLContext | None = None) -> Iterator[str]:
    """A loopback server that reads one request, sends `raw` and closes the connection."""
    listener = socket.create_server(("127.0.0.1", 0))
    seen: list[bytes] = []

    def serve() -> None:
        conn, _ = listener.accept()
        if tls is not None:
            try:
                conn = tls.wrap_socket(conn, server_side=True)
            except (ssl.SSLError, OSError):
                conn.close()  # the client refused our certificate
                return
        with conn:
            request = b""
            while b"\r\n\r\n" not in request:
                request += conn.recv(65536)
            seen.append(request)
            conn.sendall(raw)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield f"{'https' if tls else 'http'}://127.0.0.1:{listener.getsockname()[1]}"
    finally:
        thread.join(timeout=10)
        listener.close()


def read_body(response) -> bytes:
    out = bytearray()
    view = memoryview(bytearray(7))  # smaller than the body: several reads
    while n := response.readinto(view):
        out += view[:n]
    return bytes(out)


def test_a_body_of_content_length_bytes_is_read_whole_and_the_request_carries_the_headers() -> None:
    body = bytes(range(256)) * 3
    answer = b"HTTP/1.1 200 OK\r\nContent-Length: 768\r\nX-Sha256: x\r\n\r\n" + body
    with one_answer(answer) as url, bulk_get(url, "/a/b?c=1", {"Authorization": "Bearer t"}) as response:
        assert response.status == 200 and response.headers["x-sha256"] == "x"
        assert read_body(response) == body


def test_a_connection_closed_before_the_body_ends_is_an_error() -> None:
    short = b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n0123456789"
    with (
        one_answer(short) as url,
        bulk_get(url, "/f", {}) as response,
        pytest.raises(BulkGetError, match="90 bytes before"),
    ):
        read_body(response)


def test_an_error_answer_is_read_as_a_small_body_and_chunked_bodies_are_refused() -> None:
    error = b'{"error": "gone"}'
    answer = b"HTTP/1.1 410 Gone\r\nContent-Length: %d\r\n\r\n%s" % (len(error), error)
    with one_answer(answer) as url, bulk_get(url, "/f", {}) as response:
        assert response.status == 410 and response.read_all() == error
    chunked = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n"
    with one_answer(chunked) as url, pytest.raises(BulkGetError, match="Transfer-Encoding"):
        bulk_get(url, "/f", {})


def test_a_server_behind_a_proxy_from_the_environment_is_left_to_httpx(monkeypatch) -> None:
    for name in (
        "http_proxy",
        "https_proxy",
        "all_proxy",
        "no_proxy",
        "HTTP_PROXY",
        "HTTPS_PROXY",
        "NO_PROXY",
    ):
        monkeypatch.delenv(name, raising=False)
    assert not proxied("https://tuneplane.example:8443")
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy.example:3128")
    assert proxied("https://tuneplane.example:8443")
    monkeypatch.setenv("NO_PROXY", "tuneplane.example")
    assert not proxied("https://tuneplane.example:8443")


def test_https_is_verified_against_the_configured_ca_bundle(tmp_path) -> None:
    ca, cert, key = _test_pki(tmp_path)
    server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server.load_cert_chain(cert, key)
    answer = b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello"
    with one_answer(answer, server) as url, bulk_get(url, "/f", {}, ca_bundle=str(ca)) as response:
        assert read_body(response) == b"hello"
    with one_answer(answer, server) as url, pytest.raises(ssl.SSLCertVerificationError):
        bulk_get(url, "/f", {})
