"""One supervisor for `tuneplane up`: each component is its own child process.

A child that dies is reported with its exit status and log file and restarted a bounded number of times;
past that the supervisor stops everything and exits non-zero. SIGINT/SIGTERM stop the children in the
reverse of their start order (SIGTERM, a grace period, then SIGKILL). Children get PR_SET_PDEATHSIG so
that even a `kill -9` of the supervisor leaves no component running.
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
    ready_timeout: float = 60.0


@dataclass
class _Running:
    component: Component
    process: subprocess.Popen
    log_path: Path
    restarts: list[float] = field(default_factory=list)


class ComponentFailed(RuntimeError):
    pass


class Supervisor:
    def __init__(
        self,
        log_dir: Path,
        report: Callable[[str], None],
        *,
        max_restarts: int = 3,
        restart_window: float = 60.0,
        grace: float = 10.0,
    ) -> None:
        self.log_dir = log_dir
        self.report = report
        self.max_restarts = max_restarts
        self.restart_window = restart_window
        self.grace = grace
        self.running: list[_Running] = []
        self.stop_requested = threading.Event()
        self.exit_code = 0

    def install_signal_handlers(self) -> None:
        def handler(signum: int, _frame: object) -> None:
            self.report(f"received {signal.Signals(signum).name}; stopping")
            self.stop_requested.set()

        signal.signal(signal.SIGINT, handler)
        signal.signal(signal.SIGTERM, handler)

    def _spawn(self, component: Component) -> tuple[subprocess.Popen, Path]:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        log_path = self.log_dir / f"{component.name}.log"
        env = {**os.environ, **component.env, "PYTHONUNBUFFERED": "1"}
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

    def start(self, component: Component) -> None:
        process, log_path = self._spawn(component)
        entry = _Running(component, process, log_path)
        self.running.append(entry)
        if component.ready is not None:
            deadline = time.monotonic() + component.ready_timeout
            while not component.ready():
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

    def watch(self) -> int:
        """Run until a stop is requested or a component fails for good; returns the exit status."""
        while not self.stop_requested.wait(0.25):
            for entry in self.running:
                code = entry.process.poll()
                if code is None:
                    continue
                self.report(f"{entry.component.name} exited with status {code}; log: {entry.log_path}")
                now = time.monotonic()
                entry.restarts = [t for t in entry.restarts if now - t < self.restart_window]
                if len(entry.restarts) >= self.max_restarts:
                    self.report(
                        f"{entry.component.name} failed {self.max_restarts + 1} times within "
                        f"{self.restart_window:.0f}s; stopping TunePlane"
                    )
                    self.exit_code = 1
                    self.stop_requested.set()
                    break
                entry.restarts.append(now)
                entry.process, entry.log_path = self._spawn(entry.component)
                self.report(f"restarted {entry.component.name} (pid {entry.process.pid})")
        self.stop_all()
        return self.exit_code

    def stop_all(self) -> None:
        for entry in reversed(self.running):
            process = entry.process
            if process.poll() is None:
                process.terminate()
                try:
                    process.wait(self.grace)
                except subprocess.TimeoutExpired:
                    self.report(f"{entry.component.name} ignored SIGTERM for {self.grace:.0f}s; killing it")
                    process.kill()
                    process.wait()
            self.report(f"stopped {entry.component.name}")
        self.running.clear()
