"""Sending spooled batches to the telemetry gateway, oldest first, `parallel` at a time (two in flight
let the database load one batch while the next one travels and is decoded).

2xx (stored, or already stored: a duplicate) acknowledges the batch. Any other 4xx is final: the gateway
refuses points one by one and answers 4xx only for a batch it can never take (malformed, a token revoked
or of another member), so the batch is set aside in the spool's rejected/ folder with the reason and
cannot block the rest. Only an outage is retried with a capped exponential backoff (connection errors,
5xx, 408 and 429); the batch stays in the spool meanwhile. A 503 with Retry-After (the gateway's database is
away: a restart, a failover) is retried after the pause it asks for instead, whatever the backoff reached.

Batches go out over the standard library's http.client, one kept-alive connection per sender thread (TLS
with the API client's trust: the CA bundle, else SSL_CERT_FILE/SSL_CERT_DIR, else certifi). httpx only
where the environment names a proxy for the gateway: importing it is 0.2 CPU-seconds, as much as the rest
of a collector's start, paid by every member (ADR 0165).
"""

from __future__ import annotations

import http.client
import json
import logging
import os
import random
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from tuneplane.app.client.transport import check_transport, proxied, retry_after, verify_setting
from tuneplane.app.telemetry.wire import CONTENT_TYPE
from tuneplane.workers.collector.spool import Spool

if TYPE_CHECKING:
    import httpx

log = logging.getLogger(__name__)

RETRY_STATUSES = frozenset({408, 429})


@dataclass
class ShipperStats:
    sent: int = 0
    duplicates: int = 0
    rejected: int = 0
    failures: int = 0
    last_error: str = ""
    last_ok_at: float | None = None


class Shipper:
    def __init__(
        self,
        spool: Spool,
        gateway_url: str,
        token: str,
        *,
        ca_bundle: str | None = None,
        timeout: float = 60.0,
        max_backoff: float = 10.0,
        parallel: int = 2,
    ) -> None:
        check_transport(gateway_url)
        self.spool = spool
        self.url = gateway_url.rstrip("/") + "/v1/telemetry/batches"
        self.stats = ShipperStats()
        self.max_backoff = max_backoff
        self._stopping = threading.Event()
        self._stats_lock = threading.Lock()
        self._threads = [
            threading.Thread(target=self.run, name=f"telemetry-shipper-{i}", daemon=True)
            for i in range(parallel)
        ]
        self._client_settings = {
            "timeout": timeout,
            "verify": verify_setting(ca_bundle),
            "headers": {
                "Authorization": f"Bearer {token}",
                "Content-Type": CONTENT_TYPE,
                "User-Agent": "tuneplane-collector",
            },
        }
        self._client_lock = threading.Lock()
        self._client: httpx.Client | None = None
        self._proxied = proxied(self.url)
        self._ca_bundle = ca_bundle
        self._timeout = timeout
        self._local = threading.local()  # each sender thread's http.client connection

    def _http(self) -> httpx.Client:
        """The httpx client of a proxied gateway, made by the first sender thread that needs it."""
        with self._client_lock:
            if self._client is None:
                import httpx

                self._client = httpx.Client(**self._client_settings)
            return self._client

    def _connection(self) -> http.client.HTTPConnection:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            parts = urlsplit(self.url)
            if parts.scheme == "https":
                conn = http.client.HTTPSConnection(
                    parts.hostname, parts.port, timeout=self._timeout, context=_tls_context(self._ca_bundle)
                )
            else:
                conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=self._timeout)
            self._local.conn = conn
        return conn

    def _post(self, payload: bytes) -> tuple[int, bytes, str | None]:
        """(status, body, Retry-After) of one POST; raises _Unreachable when no answer came."""
        if self._proxied:
            import httpx

            try:
                response = self._http().post(self.url, content=payload)
            except httpx.HTTPError as exc:
                raise _Unreachable(str(exc)) from exc
            return response.status_code, response.content, response.headers.get("Retry-After")
        conn = self._connection()
        try:
            conn.request(
                "POST", urlsplit(self.url).path, body=payload, headers=self._client_settings["headers"]
            )
            response = conn.getresponse()
            return response.status, response.read(), response.getheader("Retry-After")
        except (OSError, http.client.HTTPException) as exc:
            conn.close()  # a new connection for the next try (the gateway restarted, a keep-alive timed out)
            self._local.conn = None
            raise _Unreachable(f"{type(exc).__name__}: {exc}") from exc

    def start(self) -> None:
        for thread in self._threads:
            thread.start()

    def stop(self) -> None:
        self._stopping.set()

    def join(self, timeout: float | None = None) -> None:
        for thread in self._threads:
            thread.join(timeout)
        if self._client is not None:
            self._client.close()

    def run(self) -> None:
        backoff = 0.0
        while not self._stopping.is_set():
            record = self.spool.next_pending(timeout=0.2)
            if record is None:
                continue
            try:
                ok, asked = self._send(record)
            except Exception as exc:  # never lose the thread: the record is offered again
                self._failed(f"sending failed: {exc}")
                ok, asked = False, None
            if ok:
                backoff = 0.0
                continue
            self.spool.release(record)
            if asked is not None:  # the pause the gateway asked for, a little more so collectors spread out
                self._stopping.wait(max(asked, 0.1) * (1 + random.random() / 4))
                continue
            backoff = min(self.max_backoff, max(0.2, backoff * 2))
            self._stopping.wait(backoff * (0.5 + random.random() / 2))
        conn = getattr(self._local, "conn", None)
        if conn is not None:
            conn.close()

    def _send(self, record) -> tuple[bool, float | None]:
        """(whether the record is done with: stored or set aside, the pause a 503 asked for)."""
        payload = self.spool.read(record)
        try:
            status, content, asked = self._post(payload)
        except _Unreachable as exc:
            self._failed(f"cannot reach the gateway: {exc}")
            return False, None
        body = _json(content)
        if 200 <= status < 300:
            with self._stats_lock:
                if body.get("duplicate"):
                    self.stats.duplicates += 1
                self.stats.sent += 1
                self.stats.last_ok_at = time.time()
            self.spool.ack(record.seq)
            return True, None
        reason = body.get("error") or content[:200].decode("utf-8", "replace")
        if 400 <= status < 500 and status not in RETRY_STATUSES:
            log.error("gateway refused batch %d (%d: %s); kept in rejected/", record.seq, status, reason)
            with self._stats_lock:
                self.stats.rejected += 1
            self.spool.reject(record, f"{status} {reason}")
            return True, None
        self._failed(f"gateway answered {status}: {reason}")
        return False, retry_after(status, asked)

    def _failed(self, message: str) -> None:
        with self._stats_lock:
            if message != self.stats.last_error:
                log.warning("%s; retrying with backoff (the spool keeps the data)", message)
            self.stats.failures += 1
            self.stats.last_error = message


class _Unreachable(Exception):
    """No answer from the gateway (connection refused or lost, a timeout): retried with backoff."""


def _json(content: bytes) -> dict:
    try:
        body = json.loads(content)
    except ValueError:
        return {}
    return body if isinstance(body, dict) else {}


def _tls_context(ca_bundle: str | None):
    """The API client's trust (app/client/bulk_get.tls_context) without importing httpx."""
    import ssl

    if ca_bundle:
        return ssl.create_default_context(cafile=ca_bundle)
    cafile, capath = os.environ.get("SSL_CERT_FILE"), os.environ.get("SSL_CERT_DIR")
    if not (cafile or capath):
        import certifi

        cafile = certifi.where()
    return ssl.create_default_context(cafile=cafile, capath=capath)
