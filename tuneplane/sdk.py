"""Metrics from inside a workload: `from tuneplane import sdk; sdk.log({"loss": x}, step=n)`.

Points are buffered and posted to the telemetry gateway from a background thread (at most every
`flush_interval` seconds or `max_buffer` points), using the member's narrow token from the environment
(TUNEPLANE_TELEMETRY_URL, TUNEPLANE_TELEMETRY_TOKEN). Each post carries (client id, sequence number); a
failed post is retried with the same id, so the gateway stores it once. Without those variables `log` does
nothing: the file path (TensorBoard/JSONL read by the collector) works without the SDK. Pending points are
flushed at interpreter exit (best effort, bounded by `exit_timeout`).
"""

from __future__ import annotations

import atexit
import logging
import math
import os
import threading
import time
import uuid
from collections.abc import Mapping

_logger = logging.getLogger("tuneplane.sdk")

ENV_URL = "TUNEPLANE_TELEMETRY_URL"
ENV_TOKEN = "TUNEPLANE_TELEMETRY_TOKEN"


class Client:
    def __init__(
        self,
        url: str,
        token: str,
        *,
        source: str = "sdk",
        flush_interval: float = 1.0,
        max_buffer: int = 5000,
        exit_timeout: float = 10.0,
    ) -> None:
        import httpx

        from app.client.http import check_transport

        check_transport(url)
        self.url = url.rstrip("/") + "/v1/telemetry/points"
        self.source = source
        self.flush_interval = flush_interval
        self.max_buffer = max_buffer
        self.exit_timeout = exit_timeout
        self.client_id = f"sdk-{uuid.uuid4().hex}"
        self._http = httpx.Client(timeout=30, headers={"Authorization": f"Bearer {token}"})
        self._lock = threading.Condition()
        self._buffer: list[dict] = []
        self._outbox: list[tuple[int, list[dict]]] = []  # sealed batches: (seq, points), retried as is
        self._seq = 0
        self._closed = False
        self.sent_points = 0
        self._thread = threading.Thread(target=self._run, name="tuneplane-sdk", daemon=True)
        self._thread.start()

    def log(self, metrics: Mapping[str, float], step: int, wall_time: float | None = None) -> None:
        now = time.time() if wall_time is None else float(wall_time)
        points = []
        for name, value in metrics.items():
            number = float(value)
            if math.isinf(number):
                continue
            points.append({"name": str(name), "step": int(step), "value": number, "wall_time": now})
        with self._lock:
            self._buffer.extend(points)
            if len(self._buffer) >= self.max_buffer:
                self._lock.notify_all()

    def _should_wake(self) -> bool:
        return self._closed or len(self._buffer) >= self.max_buffer

    def _seal(self) -> None:
        if self._buffer:
            self._seq += 1
            self._outbox.append((self._seq, self._buffer))
            self._buffer = []

    def _run(self) -> None:
        backoff = 0.2
        while True:
            with self._lock:
                if not self._outbox:
                    self._lock.wait_for(self._should_wake, timeout=self.flush_interval)
                    self._seal()
                if self._closed and not self._outbox:
                    return
                if not self._outbox:
                    continue
                seq, points = self._outbox[0]
            if self._post(seq, points):
                backoff = 0.2
                with self._lock:
                    self._outbox.pop(0)
                    self.sent_points += len(points)
                    self._lock.notify_all()
            else:
                time.sleep(backoff)
                backoff = min(backoff * 2, 10.0)

    def _post(self, seq: int, points: list[dict]) -> bool:
        import httpx

        body = {"client": self.client_id, "seq": seq, "source": self.source, "points": points}
        try:
            response = self._http.post(self.url, json=body)
        except httpx.HTTPError as exc:
            _logger.debug("telemetry post failed: %s", exc)
            return False
        if response.status_code in (400, 409, 413, 422):
            _logger.warning("telemetry gateway refused %d points: %s", len(points), response.text[:200])
            return True  # never retried: it would be refused again
        return response.is_success

    def flush(self, timeout: float = 30.0) -> bool:
        """Send everything logged so far; True when the gateway has it all."""
        deadline = time.monotonic() + timeout
        with self._lock:
            self._seal()
            self._lock.notify_all()
            while self._outbox:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self._lock.wait(min(remaining, 0.1))
        return True

    def close(self) -> None:
        self.flush(self.exit_timeout)
        with self._lock:
            self._closed = True
            self._lock.notify_all()
        self._thread.join(self.exit_timeout)
        self._http.close()


_client: Client | None = None
_client_lock = threading.Lock()


def _default_client() -> Client | None:
    global _client
    with _client_lock:
        if _client is None:
            url, token = os.environ.get(ENV_URL), os.environ.get(ENV_TOKEN)
            if not url or not token:
                return None
            _client = Client(url, token)
            atexit.register(_client.close)
        return _client


def log(metrics: Mapping[str, float], step: int, wall_time: float | None = None) -> None:
    """Record `metrics` at `step` (no-op when the workload runs without a telemetry token)."""
    client = _default_client()
    if client is not None:
        client.log(metrics, step, wall_time)


def flush(timeout: float = 30.0) -> bool:
    client = _default_client()
    return True if client is None else client.flush(timeout)
