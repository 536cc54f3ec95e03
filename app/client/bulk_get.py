"""One HTTP/1.1 GET whose body is read straight from the socket into the caller's buffer, for large
downloads the client verifies itself (`tuneplane artifacts download`).

httpx reads a body 64 KiB at a time and copies each piece through h11's buffers; for a 20 GB checkpoint
that Python loop, not the disk or the hash, set the pace (loopback, 256 MiB: 0.42 s through httpx, 0.20 s
with `recv_into` a 4 MiB buffer, both hashing). This speaks just enough HTTP/1.1 for one request per
connection (`Connection: close`): a status line, headers, and a body of `Content-Length` bytes or up to
the end of the connection. TLS is verified with the API client's trust (`tls_context`); when the
environment names a proxy for the server, callers use httpx instead (`proxied`).
"""

from __future__ import annotations

import socket
import ssl
from typing import Any
from urllib.parse import urlsplit

import httpx

from tuneplane.app.client.transport import proxied  # noqa: F401 - callers import it from here

MAX_HEAD = 64 * 1024


class BulkGetError(OSError):
    """The server's answer is not HTTP/1.1 this reader understands, or the connection broke."""


class BulkResponse:
    def __init__(self, sock: socket.socket, status: int, headers: dict[str, str], rest: bytes) -> None:
        self.sock = sock
        self.status = status
        self.headers = headers
        self._rest = memoryview(rest)
        length = headers.get("content-length")
        self.remaining: int | None = int(length) if length is not None and length.isdigit() else None

    def readinto(self, view: memoryview) -> int:
        """Up to len(view) body bytes into view; 0 at the end of the body."""
        if self.remaining == 0:
            return 0
        limit = len(view) if self.remaining is None else min(len(view), self.remaining)
        if self._rest:
            n = min(limit, len(self._rest))
            view[:n] = self._rest[:n]
            self._rest = self._rest[n:]
        else:
            n = self.sock.recv_into(view, limit)
            if n == 0 and self.remaining is not None:
                raise BulkGetError(f"the connection closed {self.remaining} bytes before the end of the body")
        if self.remaining is not None:
            self.remaining -= n
        return n

    def read_all(self, limit: int = 1024 * 1024) -> bytes:
        """The rest of a small body (an error's JSON)."""
        buffer = bytearray(limit)
        view = memoryview(buffer)
        got = 0
        while got < limit and (n := self.readinto(view[got:])):
            got += n
        return bytes(buffer[:got])

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> BulkResponse:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def tls_context(ca_bundle: str | None) -> ssl.SSLContext:
    """The trust the API client's httpx has (app/client/http.py): the configured CA bundle, else httpx's
    default (SSL_CERT_FILE or SSL_CERT_DIR from the environment, else certifi). Verification is never off."""
    if ca_bundle:
        return ssl.create_default_context(cafile=ca_bundle)
    return httpx.create_ssl_context()


def bulk_get(
    base_url: str, path: str, headers: dict[str, str], *, ca_bundle: str | None = None, timeout: float = 300.0
) -> BulkResponse:
    parts = urlsplit(base_url.rstrip("/") + path)
    host = parts.hostname or ""
    port = parts.port or (443 if parts.scheme == "https" else 80)
    sock = socket.create_connection((host, port), timeout=timeout)
    try:
        if parts.scheme == "https":
            sock = tls_context(ca_bundle).wrap_socket(sock, server_hostname=host)
        target = parts.path + (f"?{parts.query}" if parts.query else "")
        lines = [f"GET {target} HTTP/1.1", f"Host: {parts.netloc}", "Connection: close"]
        lines += [f"{name}: {value}" for name, value in headers.items()]
        sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1"))
        head = b""
        while b"\r\n\r\n" not in head:
            if len(head) > MAX_HEAD:
                raise BulkGetError(f"response headers longer than {MAX_HEAD} bytes")
            more = sock.recv(65536)
            if not more:
                raise BulkGetError("the connection closed before the response headers ended")
            head += more
        raw, _, rest = head.partition(b"\r\n\r\n")
        status, parsed = _parse_head(raw.decode("latin-1"))
        if parsed.get("transfer-encoding", "identity").lower() != "identity":
            raise BulkGetError(f"unsupported Transfer-Encoding {parsed['transfer-encoding']!r}")
        return BulkResponse(sock, status, parsed, rest)
    except BaseException:
        sock.close()
        raise


def _parse_head(text: str) -> tuple[int, dict[str, str]]:
    status_line, *header_lines = text.split("\r\n")
    version, _, remainder = status_line.partition(" ")
    code = remainder[:3]
    if not version.startswith("HTTP/1.") or not code.isdigit():
        raise BulkGetError(f"not an HTTP/1.x status line: {status_line[:80]!r}")
    headers: dict[str, Any] = {}
    for line in header_lines:
        name, sep, value = line.partition(":")
        if sep:
            headers[name.strip().lower()] = value.strip()
    return int(code), headers
