"""Small helpers for tests: bounded polling and reading a child's output until a line appears."""

from __future__ import annotations

import subprocess
import threading
import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_for(
    predicate: Callable[[], T],
    timeout: float = 20.0,
    interval: float = 0.05,
    what: str = "",
    explain: Callable[[], str] | None = None,
) -> T:
    """Poll `predicate` until it returns something truthy; fail the test after `timeout` seconds, with what
    `explain()` says about the state then (an e2e test's processes and events)."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            detail = f"\n{explain()}" if explain is not None else ""
            raise AssertionError(f"timed out after {timeout}s waiting for {what or predicate}{detail}")
        time.sleep(interval)


class OutputWatcher:
    """Collects a child's stdout lines in a thread so a test can wait for a line without blocking forever."""

    def __init__(self, process: subprocess.Popen) -> None:
        self.lines: list[str] = []
        self._cond = threading.Condition()
        self._thread = threading.Thread(target=self._pump, args=(process,), daemon=True)
        self._thread.start()

    def _pump(self, process: subprocess.Popen) -> None:
        assert process.stdout is not None
        for raw in process.stdout:
            line = raw.decode(errors="replace") if isinstance(raw, bytes) else raw
            with self._cond:
                self.lines.append(line.rstrip("\n"))
                self._cond.notify_all()

    def wait_for_line(self, needle: str, timeout: float = 60.0) -> str:
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                for line in self.lines:
                    if needle in line:
                        return line
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise AssertionError(
                        f"no line containing {needle!r} after {timeout}s; got:\n"
                        + "\n".join(self.lines[-40:])
                    )
                self._cond.wait(remaining)

    def text(self) -> str:
        with self._cond:
            return "\n".join(self.lines)
