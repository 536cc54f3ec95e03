"""One supervisor for `tuneplane up`: each component is its own child process.

A child that dies is reported with its exit status, the last lines of its log and the log file, and is
restarted after a delay that doubles with every failure in a row (base 0.5 s, capped at 30 s). A restarted
child counts as healthy again (its next failure starts from 0.5 s) once its ready check passes (a
callable, or a line it writes to its log once ready), or once it has run for `stable_after` seconds. The
other children keep running meanwhile. After `max_restarts` failures in a row the supervisor stops
everything and exits non-zero, naming the last exit. SIGINT/SIGTERM stop the children in the reverse of
their start order (SIGTERM, a grace period, then SIGKILL). Children get PR_SET_PDEATHSIG so that even a
`kill -9` of the supervisor leaves no component running.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    except OSError:
        pass  # not Linux: the supervisor's own shutdown path still stops children
    # A terminal's Ctrl-C goes to the supervisor, which then stops children in order.
    os.setpgrp()


@dataclass
class Component:
    name: str
    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)
    # Called until it returns True after start; None means "started is ready".
    ready: Callable[[], bool] | None = None
    # Or: a line the child writes to its log once it is ready (checked in what it wrote since its start).
    ready_line: str | None = None
    ready_timeout: float = 60.0
    # Variables of `up`'s own environment this child must not inherit: the node agent gets none of the
    # server's secrets (the S3 store's keys, app/s3store.py SERVER_ONLY_ENV), as a remote node would not.
    withhold_env: tuple[str, ...] = ()


@dataclass
class _Running:
    component: Component
    process: subprocess.Popen
    log_path: Path
    started_at: float = field(default_factory=time.monotonic)
    # Where its log ended when this run of the child started (ready_line is looked for after it).
    log_offset: int = 0
    # Failures in a row (reset once the restarted child is ready, or ran stable_after seconds).
    failures: int = 0
    # When the dead child is started again (None while it runs).
    restart_at: float | None = None
    last_exit: str = ""


def describe_status(code: int) -> str:
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with status {code}"


def log_tail(path: Path, lines: int = 3, limit: int = 400) -> str:
    """The last non-empty lines of a child's log, for saying why it died."""
    try:
        with open(path, "rb") as handle:
            handle.seek(0, os.SEEK_END)
            size = handle.tell()
            handle.seek(max(0, size - 8192))
            text = handle.read().decode(errors="replace")
    except OSError:
        return ""
    kept = [line.strip() for line in text.splitlines() if line.strip()][-lines:]
    return " | ".join(kept)[-limit:]


class ComponentFailed(RuntimeError):
    pass


class _StopRequest(threading.Event):
    """A stop asked for by a caller (set) or by a signal (`signalled`: written by the signal handler without
    a lock, read here)."""

    signalled: int = 0

    def is_set(self) -> bool:
        return bool(self.signalled) or super().is_set()

    def wait(self, timeout: float | None = None) -> bool:
        return bool(self.signalled) or super().wait(timeout) or bool(self.signalled)


class Supervisor:
    def __init__(
        self,
        log_dir: Path,
        report: Callable[[str], None],
        *,
        max_restarts: int = 8,
        backoff_base: float = 0.5,
        backoff_cap: float = 30.0,
        stable_after: float = 10.0,
        grace: float = 10.0,
    ) -> None:
        self.log_dir = log_dir
        self.report = report
        self.max_restarts = max_restarts
        self.backoff_base = backoff_base
        self.backoff_cap = backoff_cap
        self.stable_after = stable_after
        self.grace = grace
        self.running: list[_Running] = []
        self.stop_requested = _StopRequest()
        self.exit_code = 0

    def install_signal_handlers(self) -> None:
        # The handler runs on the main thread, which may hold stop_requested's lock (inside its wait) or
        # the output's: taking either there deadlocks `up` for good (seen in CI). It only records the
        # signal; stop_requested reads it without a lock, and watch() says it.
        def handler(signum: int, _frame: object) -> None:
            self.stop_requested.signalled = signum

        signal.signal(signal.SIGINT, handler)
        signal.signal(signal.SIGTERM, handler)

    def _spawn(self, component: Component) -> tuple[subprocess.Popen, Path]:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        log_path = self.log_dir / f"{component.name}.log"
        inherited = {k: v for k, v in os.environ.items() if k not in component.withhold_env}
        env = {**inherited, **component.env, "PYTHONUNBUFFERED": "1"}
        with open(log_path, "ab") as log:
            process = subprocess.Popen(
                component.argv,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
                preexec_fn=_die_with_parent,
            )
        return process, log_path

    def _log_size(self, component: Component) -> int:
        try:
            return (self.log_dir / f"{component.name}.log").stat().st_size
        except OSError:
            return 0

    def is_ready(self, entry: _Running) -> bool | None:
        """The child's ready check (its callable, or its ready line in its log); None when it has none."""
        component = entry.component
        if component.ready is not None:
            return bool(component.ready())
        if component.ready_line is None:
            return None
        try:
            with open(entry.log_path, "rb") as handle:
                handle.seek(entry.log_offset)
                written = handle.read(1024 * 1024).decode(errors="replace")
        except OSError:
            return False
        return component.ready_line in written

    def start(self, component: Component) -> None:
        offset = self._log_size(component)
        process, log_path = self._spawn(component)
        entry = _Running(component, process, log_path, log_offset=offset)
        self.running.append(entry)
        if component.ready is not None or component.ready_line is not None:
            deadline = time.monotonic() + component.ready_timeout
            while not self.is_ready(entry):
                if process.poll() is not None:
                    raise ComponentFailed(
                        f"{component.name} exited with status {process.returncode} while starting; "
                        f"see {log_path}"
                    )
                if self.stop_requested.is_set():
                    return
                if time.monotonic() > deadline:
                    raise ComponentFailed(
                        f"{component.name} was not ready after {component.ready_timeout:.0f}s; see {log_path}"
                    )
                time.sleep(0.1)
        self.report(f"started {component.name} (pid {process.pid}, log {log_path})")

    def backoff(self, failures: int) -> float:
        """The delay before restarting a child that failed `failures` times in a row (1, 2, …)."""
        return min(self.backoff_cap, self.backoff_base * 2 ** min(failures - 1, 30))

    def watch(self) -> int:
        """Run until a stop is requested or a component fails for good; returns the exit status."""
        while not self.stop_requested.wait(0.1):
            now = time.monotonic()
            for entry in self.running:
                if entry.restart_at is not None:
                    if now >= entry.restart_at:
                        self._restart(entry)
                    continue
                code = entry.process.poll()
                if code is None:
                    if entry.failures and self._healthy_again(entry, now):
                        self.report(f"{entry.component.name} is up again after {entry.failures} failure(s)")
                        entry.failures = 0
                    continue
                if not self._died(entry, code, now):
                    break
        if self.stop_requested.signalled:
            self.report(f"received {signal.Signals(self.stop_requested.signalled).name}; stopping")
        self.stop_all()
        return self.exit_code

    def _died(self, entry: _Running, code: int, now: float) -> bool:
        """Report a dead child and schedule its restart; False when it failed too often (stop all)."""
        name = entry.component.name
        entry.failures += 1
        tail = log_tail(entry.log_path)
        entry.last_exit = describe_status(code) + (f" (last log lines: {tail})" if tail else "")
        if entry.failures > self.max_restarts:
            self.report(
                f"{name} {entry.last_exit}; it failed {entry.failures} times in a row without becoming "
                f"healthy again; stopping TunePlane. Log: {entry.log_path}"
            )
            self.exit_code = 1
            self.stop_requested.set()
            return False
        delay = self.backoff(entry.failures)
        self.report(
            f"{name} {entry.last_exit}; failure {entry.failures} in a row, restarting in {delay:.1f}s. "
            f"Log: {entry.log_path}"
        )
        entry.restart_at = now + delay
        return True

    def _healthy_again(self, entry: _Running, now: float) -> bool:
        if now - entry.started_at >= self.stable_after:
            return True
        try:
            return bool(self.is_ready(entry))
        except Exception:  # a ready check that fails says "not yet"
            return False

    def _restart(self, entry: _Running) -> None:
        entry.restart_at = None
        entry.log_offset = self._log_size(entry.component)
        try:
            entry.process, entry.log_path = self._spawn(entry.component)
        except OSError as exc:
            # Could not even start it: counts as one more failure, with the reason.
            self.report(f"{entry.component.name} could not be started again: {exc}")
            entry.failures += 1
            entry.restart_at = time.monotonic() + self.backoff(entry.failures)
            return
        entry.started_at = time.monotonic()
        self.report(f"restarted {entry.component.name} (pid {entry.process.pid})")

    def stop_all(self) -> None:
        for entry in reversed(self.running):
            process = entry.process
            if entry.restart_at is None and process.poll() is None:
                process.terminate()
                try:
                    process.wait(self.grace)
                except subprocess.TimeoutExpired:
                    self.report(f"{entry.component.name} ignored SIGTERM for {self.grace:.0f}s; killing it")
                    process.kill()
                    process.wait()
            self.report(f"stopped {entry.component.name}")
        self.running.clear()
