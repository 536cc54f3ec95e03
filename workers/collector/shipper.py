"""Sending spooled batches to the telemetry gateway, oldest first, `parallel` at a time (two in flight
let the database load one batch while the next one travels and is decoded).

2xx (stored, or already stored: a duplicate) acknowledges the batch. Any other 4xx is final: the gateway
refuses points one by one and answers 4xx only for a batch it can never take (malformed, a token revoked
or of another member), so the batch is set aside in the spool's rejected/ folder with the reason and
cannot block the rest. Only an outage is retried with a capped exponential backoff (connection errors,
5xx, 408 and 429); the batch stays in the spool meanwhile.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from tuneplane.app.client.transport import check_transport, verify_setting
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

    def _http(self) -> httpx.Client:
        """The HTTP client, made by the first sender thread that needs it: importing httpx and loading the
        CA bundle (~0.1 s) then happens while the collector reads its first batch, not before."""
        with self._client_lock:
            if self._client is None:
                import httpx

                self._client = httpx.Client(**self._client_settings)
            return self._client

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
        self._http()
        while not self._stopping.is_set():
            record = self.spool.next_pending(timeout=0.2)
            if record is None:
                continue
            try:
                ok = self._send(record)
            except Exception as exc:  # never lose the thread: the record is offered again
                self._failed(f"sending failed: {exc}")
                ok = False
            if ok:
                backoff = 0.0
                continue
            self.spool.release(record)
            backoff = min(self.max_backoff, max(0.2, backoff * 2))
            self._stopping.wait(backoff * (0.5 + random.random() / 2))

    def _send(self, record) -> bool:
        import httpx

        payload = self.spool.read(record)
        try:
            response = self._http().post(self.url, content=payload)
        except httpx.HTTPError as exc:
            self._failed(f"cannot reach the gateway: {exc}")
            return False
        status = response.status_code
        if 200 <= status < 300:
            body = _json(response)
            with self._stats_lock:
                if body.get("duplicate"):
                    self.stats.duplicates += 1
                self.stats.sent += 1
                self.stats.last_ok_at = time.time()
            self.spool.ack(record.seq)
            return True
        reason = _json(response).get("error") or response.text[:200]
        if 400 <= status < 500 and status not in RETRY_STATUSES:
            log.error("gateway refused batch %d (%d: %s); kept in rejected/", record.seq, status, reason)
            with self._stats_lock:
                self.stats.rejected += 1
            self.spool.reject(record, f"{status} {reason}")
            return True
        self._failed(f"gateway answered {status}: {reason}")
        return False

    def _failed(self, message: str) -> None:
        with self._stats_lock:
            if message != self.stats.last_error:
                log.warning("%s; retrying with backoff (the spool keeps the data)", message)
            self.stats.failures += 1
            self.stats.last_error = message


def _json(response: httpx.Response) -> dict:
    try:
        body = response.json()
    except ValueError:
        return {}
    return body if isinstance(body, dict) else {}
