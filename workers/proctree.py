"""Finding and signalling a member's processes through /proc (Linux).

A member's processes are found three ways, because each alone can miss some: the runner's descendants
(the runner is a child subreaper, so orphans stay under it while it lives), its session, and every
process whose environment carries the member's tag (inherited by everything the workload starts, even
across setsid, as torchrun's workers do, and after the runner itself is gone).
"""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Iterator
from pathlib import Path

PROC = Path("/proc")
TAG_VARIABLE = "TUNEPLANE_MEMBER_TAG"


def _stat_fields(pid: int) -> list[str] | None:
    try:
        raw = (PROC / str(pid) / "stat").read_text()
    except OSError:
        return None
    # The command name (field 2) may contain spaces and parentheses: split after its closing parenthesis.
    head, _, rest = raw.rpartition(")")
    if not head:
        return None
    return rest.split()


def start_time(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (tells a reused pid from the original)."""
    fields = _stat_fields(pid)
    return int(fields[19]) if fields else None


def alive(pid: int, started: int | None = None) -> bool:
    fields = _stat_fields(pid)
    if fields is None or fields[0] in ("Z", "X"):
        return False
    return started is None or int(fields[19]) == started


def _all_pids() -> list[int]:
    return [int(p.name) for p in PROC.iterdir() if p.name.isdigit()]


def descendants(root: int) -> set[int]:
    children: dict[int, list[int]] = {}
    for pid in _all_pids():
        fields = _stat_fields(pid)
        if fields:
            children.setdefault(int(fields[1]), []).append(pid)
    found: set[int] = set()
    stack = [root]
    while stack:
        for child in children.get(stack.pop(), []):
            if child not in found:
                found.add(child)
                stack.append(child)
    return found


def child_pids(parent: int) -> list[int] | None:
    """`parent`'s children, from /proc/<pid>/task/*/children (CONFIG_PROC_CHILDREN: zombies included);
    None where the kernel has no such file. A few reads instead of one per process on the machine."""
    found: list[int] = []
    try:
        tasks = list((PROC / str(parent) / "task").iterdir())
    except OSError:
        return None
    for task in tasks:
        try:
            found.extend(int(pid) for pid in (task / "children").read_text().split())
        except FileNotFoundError:
            if not task.exists():
                continue  # that thread ended meanwhile
            return None  # the kernel has no children file
        except OSError:
            continue
    return found


def zombie_children(parent: int) -> set[int]:
    """Children of `parent` that ended and were not waited for yet (state Z). The agent's reaper asks every
    second: reading its own children, not every process's stat file (8 agents on one machine scanned
    /proc 8 times a second)."""
    found = set()
    children = child_pids(parent)
    for pid in _all_pids() if children is None else children:
        fields = _stat_fields(pid)
        if fields and fields[0] == "Z" and int(fields[1]) == parent:
            found.add(pid)
    return found


def in_session(sid: int) -> set[int]:
    found = set()
    for pid in _all_pids():
        fields = _stat_fields(pid)
        if fields and int(fields[3]) == sid and fields[0] not in ("Z", "X"):
            found.add(pid)
    return found


def tagged(tag: str) -> set[int]:
    needle = f"{TAG_VARIABLE}={tag}".encode() + b"\0"
    found = set()
    for pid in _all_pids():
        try:
            environ = (PROC / str(pid) / "environ").read_bytes() + b"\0"
        except OSError:
            continue
        if b"\0" + needle in b"\0" + environ:
            fields = _stat_fields(pid)
            if fields and fields[0] not in ("Z", "X"):
                found.add(pid)
    return found


def member_processes(runner_pid: int | None, runner_started: int | None, tag: str | None) -> set[int]:
    pids: set[int] = set()
    if runner_pid and alive(runner_pid, runner_started):
        pids.add(runner_pid)
        pids |= descendants(runner_pid)
        pids |= in_session(runner_pid)
    if tag:
        pids |= tagged(tag)
    pids.discard(os.getpid())
    return pids


def signal_all(pids: set[int], sig: int) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)


def signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


# What a collector may be sent before it has installed its handlers: SIGTERM and SIGINT (a drain), SIGRTMIN
# (a Slurm step's drain), and what a Slurm job's cancel or preemption sends to every process of its step.
STOP_SIGNALS = {signal.SIGTERM, signal.SIGINT, signal.SIGRTMIN, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2}


@contextlib.contextmanager
def stop_signals_blocked() -> Iterator[None]:
    """Around the Popen of a child that handles STOP_SIGNALS itself (a collector): a child starts with the
    calling thread's signal mask and keeps it across exec, so they stay pending until it has installed its
    handlers and unblocks them. Not a preexec_fn: with one, CPython forks the caller instead of using vfork,
    and copying an agent's page tables was 15 ms of its CPU per member start (issue 23). A stop signal sent
    to this process meanwhile waits in its mask, or is taken by another of its threads."""
    old = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)
