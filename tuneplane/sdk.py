"""Metrics from inside a workload: `from tuneplane import sdk; sdk.log({"loss": x}, step=n)`.

Points are buffered and posted to the telemetry gateway from a background thread (at most every
`flush_interval` seconds or `max_buffer` points), using the member's narrow token from the environment
(TUNEPLANE_TELEMETRY_URL, TUNEPLANE_TELEMETRY_TOKEN). Each post carries (client id, sequence number); a
failed post is retried with the same id, so the gateway stores it once. Without those variables `log` does
nothing: the file path (TensorBoard/JSONL read by the collector) works without the SDK. Pending points are
flushed at interpreter exit (best effort, bounded by `exit_timeout`).

Checkpoints while the workload runs: `sdk.checkpoint(path, name="checkpoint", step=n)` asks the node
agent to publish a finished checkpoint directory, holding training step n, as artifact `<name>.<k>`
(plain files under $TUNEPLANE_OUTPUT_DIR/.tuneplane/, docs/artifacts.md); `sdk.checkpoint_requested()`
says a user asked for one (`tuneplane artifacts checkpoint JOB`); `sdk.wait_for_checkpoints()` waits for
the results; `sdk.resume_dir()` is the verified checkpoint a later attempt resumes from;
`sdk.preempting()` (or a callback, `sdk.on_preemption(fn)`) says TunePlane asked the member to checkpoint
and stop (docs/preemption.md).
"""

from __future__ import annotations

import atexit
import json
import logging
import math
import os
import threading
import time
import uuid
from collections.abc import Mapping
from pathlib import Path

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

        from tuneplane.app.client.http import check_transport

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


# -- checkpoints --------------------------------------------------------------------------------------
# Plain files under $TUNEPLANE_OUTPUT_DIR/.tuneplane/ that the node agent watches
# (workers/agent/checkpoints.py): the agent publishes each requested directory as its own artifact
# version while the workload keeps running and writes the result back.

ENV_OUTPUT_DIR = "TUNEPLANE_OUTPUT_DIR"
_checkpoint_lock = threading.Lock()
_requested: list[str] = []
_seen_requests = 0


def _control_dir() -> Path | None:
    raw = os.environ.get(ENV_OUTPUT_DIR)
    return Path(raw) / ".tuneplane" if raw else None


def checkpoint(path: str | os.PathLike, name: str = "checkpoint", *, step: int | None = None,
               wait: bool = False, timeout: float = 600.0) -> dict | str | None:  # fmt: skip
    """Publish the complete checkpoint directory `path` (inside $TUNEPLANE_OUTPUT_DIR) as artifact
    `<name>.<n>`. Write every file first: the agent reads the directory when it sees the request, and a
    directory that changes while it is read is refused. `step`: the training step the checkpoint holds;
    TunePlane names it with the checkpoint ("resumed from ckpt.2 (step 1000)"). Returns the request id,
    or with wait=True the result ({"state": "complete"|"failed", "artifact": "<name>.<n>", "reason",
    "step"}); None outside TunePlane."""
    if step is not None and (not isinstance(step, int) or isinstance(step, bool) or step < 0):
        raise ValueError(f"step must be a whole number, 0 or more, not {step!r}")
    control = _control_dir()
    if control is None:
        return None
    output = control.parent
    target = Path(path)
    if not target.is_absolute():
        target = Path.cwd() / target
    relative = os.path.relpath(os.path.realpath(target), os.path.realpath(output))
    if relative.startswith(".."):
        raise ValueError(f"{path}: a checkpoint must be a directory inside {output}")
    requests = control / "checkpoints" / "requests"
    requests.mkdir(parents=True, exist_ok=True)
    with _checkpoint_lock:
        request_id = f"{time.time_ns():020d}-{os.getpid()}-{len(_requested):06d}"
        _requested.append(request_id)
    tmp = requests / f".{request_id}.tmp"
    request: dict = {"path": relative, "name": name}
    if step is not None:
        request["step"] = int(step)
    tmp.write_text(json.dumps(request))
    os.replace(tmp, requests / f"{request_id}.json")
    if not wait:
        return request_id
    return _wait_for(request_id, time.monotonic() + timeout)


def _wait_for(request_id: str, deadline: float) -> dict:
    control = _control_dir()
    assert control is not None
    result = control / "checkpoints" / "results" / f"{request_id}.json"
    while True:
        try:
            return json.loads(result.read_text())
        except (OSError, ValueError):
            pass
        if time.monotonic() >= deadline:
            return {"state": "pending", "artifact": None, "reason": "no result from the agent yet"}
        time.sleep(0.1)


def wait_for_checkpoints(timeout: float = 600.0) -> list[dict]:
    """Wait until the agent has published (or refused) every checkpoint this process asked for; their
    results in request order. Call it before exiting when a checkpoint must be complete while you run."""
    deadline = time.monotonic() + timeout
    with _checkpoint_lock:
        ids = list(_requested)
    return [_wait_for(request_id, deadline) for request_id in ids]


def checkpoint_requested() -> bool:
    """True once for every `tuneplane artifacts checkpoint JOB` a user sent to this member since the last
    call (the agent counts them in a file); the workload then saves one and calls checkpoint()."""
    global _seen_requests
    control = _control_dir()
    if control is None:
        return False
    try:
        count = int(json.loads((control / "checkpoint-requested").read_text()).get("requests", 0))
    except (OSError, ValueError, AttributeError):
        return False
    with _checkpoint_lock:
        if count > _seen_requests:
            _seen_requests = count
            return True
    return False


# -- resume -------------------------------------------------------------------------------------------
# A later attempt (after a preemption, a time limit, a lost node or a failure with attempts left) starts
# with the job's newest verified checkpoint materialized in $TUNEPLANE_RESUME_DIR (docs/preemption.md).

ENV_RESUME_DIR = "TUNEPLANE_RESUME_DIR"


def resume_dir() -> Path | None:
    """The directory of the verified checkpoint this attempt resumes from (the files of artifact
    $TUNEPLANE_RESUME_FROM, as published), or None when it starts from scratch. A Hugging Face Trainer
    takes it as `trainer.train(resume_from_checkpoint=sdk.resume_dir())`."""
    raw = os.environ.get(ENV_RESUME_DIR)
    if not raw or not Path(raw).is_dir():
        return None
    return Path(raw)


# -- preemption ---------------------------------------------------------------------------------------
# TunePlane asks a running member to checkpoint and stop (a preemption, its time limit, an idle reclaim)
# by writing $TUNEPLANE_OUTPUT_DIR/.tuneplane/preempt.json and sending the job's signal (SIGTERM unless the
# JobSpec chose another). Save a checkpoint, publish it with sdk.checkpoint(path, wait=True) and exit
# before the deadline; past it the member is stopped and the next attempt resumes from the checkpoint
# before (docs/preemption.md).

PREEMPT_FILE = "preempt.json"
ENV_PREEMPTION_SIGNAL = "TUNEPLANE_PREEMPTION_SIGNAL"
_watchers: list[threading.Thread] = []
_signal_received = threading.Event()
_trap_lock = threading.Lock()
_trapped: str | None = None


def trap_preemption_signal() -> str | None:
    """Catch the signal a preemption request sends (the job's preemption.signal, SIGTERM by default) so
    that it marks the request instead of ending the process: Python's default action for SIGTERM kills a
    workload before it can save the checkpoint it was asked for. Called by `preempting()` and
    `on_preemption()` (a workload that asks is one that cooperates); call it first thing to be safe from a
    request that arrives before the first poll. Only the main thread may install a handler, and a handler
    the workload installed itself is kept. Returns the signal's name, or None when nothing was trapped."""
    global _trapped
    import signal as signals

    name = os.environ.get(ENV_PREEMPTION_SIGNAL)
    if not name or _trapped or threading.current_thread() is not threading.main_thread():
        return _trapped
    number = getattr(signals, name, None)
    if not isinstance(number, int):
        return None
    with _trap_lock:
        if _trapped:
            return _trapped
        current = signals.getsignal(number)
        if current not in (signals.SIG_DFL, signals.default_int_handler):
            return None  # the workload handles it itself (or ignores it): its choice
        signals.signal(number, lambda _signum, _frame: _signal_received.set())
        _trapped = name
    return name


def preemption() -> dict | None:
    """The standing request ({"kind": "preempted"|"timed_out", "reason", "deadline" (epoch seconds),
    "grace_seconds", "signal"}), or None while the member may run on."""
    control = _control_dir()
    if control is None:
        return None
    try:
        body = json.loads((control / PREEMPT_FILE).read_text())
    except (OSError, ValueError):
        return None
    return body if isinstance(body, dict) else None


def preempting() -> bool:
    """True once TunePlane asked this member to checkpoint and stop (cheap: one stat; call it every step)."""
    trap_preemption_signal()
    if _signal_received.is_set():
        return True
    control = _control_dir()
    return control is not None and (control / PREEMPT_FILE).is_file()


def seconds_left() -> float | None:
    """Seconds until the grace ends (None when no request stands)."""
    request = preemption()
    if request is None or request.get("deadline") is None:
        return None
    return max(0.0, float(request["deadline"]) - time.time())


def on_preemption(callback, interval: float = 0.5) -> None:
    """Call `callback(request)` once, from a daemon thread, when a request arrives (for loops that cannot
    poll `preempting()` themselves). The callback runs beside the training loop: make it set a flag."""
    trap_preemption_signal()

    def watch() -> None:
        while True:
            request = preemption()
            if request is not None:
                callback(request)
                return
            time.sleep(interval)

    thread = threading.Thread(target=watch, name="tuneplane-preemption", daemon=True)
    thread.start()
    _watchers.append(thread)
