"""The agent's standby runners (workers/runner/standby.py, ADR 0240): runner interpreters started ahead of
any START, so that a START hands its member to one instead of starting an interpreter while the rest of a
gang starts on the same machine.

A START takes a live standby if one is ready, or starts one at once when none is (none configured, all
taken, one that died); it writes the member's order, records and reports the start, then says go. A taken
standby is replaced REFILL_DELAY seconds later, not at once: the replacement's interpreter start would
otherwise compete with the other members' starts the pool is there to spare. Every standby holds the read
end of a pipe whose write end only this agent holds, so an agent that exits or restarts leaves no standby
behind: each reads end of file and exits (and a handed one starts its member)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
from collections.abc import Callable
from pathlib import Path

from tuneplane.workers.runner import standby_command

REFILL_DELAY = 1.0
LOG_NAME = "standby-runners.log"


class StandbyRunners:
    def __init__(self, size: int, base_env: Callable[[], dict[str, str]], log_dir: Path, say) -> None:
        self.size = max(0, size)
        self.base_env = base_env
        self.log_dir = log_dir
        self.say = say
        self.ready: list[subprocess.Popen] = []
        self._refill: asyncio.TimerHandle | None = None
        self.closed = False

    def fill(self) -> None:
        """Start standbys up to the pool's size (dead ones are dropped first)."""
        self._refill = None
        self.ready = [child for child in self.ready if child.poll() is None]
        while not self.closed and len(self.ready) < self.size:
            child = self._spawn()
            if child is None:
                return
            self.ready.append(child)

    def _spawn(self) -> subprocess.Popen | None:
        try:
            with open(self.log_dir / LOG_NAME, "ab") as log:
                return subprocess.Popen(
                    standby_command(),
                    cwd=self.log_dir,
                    env=self.base_env(),
                    stdin=subprocess.PIPE,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
        except OSError as exc:
            self.say(f"standby runner not started ({exc}); members start their runner at START")
            return None

    def hand(self, member_dir: Path, env: dict[str, str]) -> subprocess.Popen | None:
        """A runner that now holds this member and waits for go() to start it: a ready standby, or one
        started now when none is ready. None when none can be started (start a runner the usual way).
        Schedules the pool's refill."""
        order = json.dumps({"member_dir": str(member_dir), "env": env}).encode() + b"\n"
        self._schedule_refill()
        for _ in range(len(self.ready) + 2):  # the ready ones, then two started now: never a busy loop
            child = self.ready.pop(0) if self.ready else self._spawn()
            if child is None:
                return None
            if child.poll() is not None:
                continue
            try:
                assert child.stdin is not None
                child.stdin.write(order)
                child.stdin.flush()
            except OSError:  # it ended meanwhile (BrokenPipeError): it runs nothing
                self.retire(child)
                continue
            return child
        return None

    @staticmethod
    def go(child: subprocess.Popen) -> None:
        """Let a handed runner start its member (its start is reported); closing the pipe says the same to a
        runner that missed the line."""
        with contextlib.suppress(OSError, ValueError):
            if child.stdin is not None and not child.stdin.closed:
                child.stdin.write(b"go\n")
                child.stdin.flush()
        with contextlib.suppress(OSError, ValueError):
            if child.stdin is not None:
                child.stdin.close()

    def _schedule_refill(self) -> None:
        if self.size and self._refill is None and not self.closed:
            with contextlib.suppress(RuntimeError):  # no running loop: the next START refills
                self._refill = asyncio.get_running_loop().call_later(REFILL_DELAY, self.fill)

    def retire(self, child: subprocess.Popen) -> None:
        """End a standby that runs nothing: closing its stdin is its end of file."""
        with contextlib.suppress(OSError):
            if child.stdin is not None:
                child.stdin.close()
        if child.poll() is None:
            with contextlib.suppress(OSError):
                child.wait(timeout=5)
        if child.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(child.pid, signal.SIGKILL)

    def children(self) -> list[subprocess.Popen]:
        return list(self.ready)

    def close(self) -> None:
        self.closed = True
        if self._refill is not None:
            self._refill.cancel()
        for child in self.ready:
            self.retire(child)
        self.ready = []
