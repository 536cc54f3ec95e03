"""A standby runner: a runner's interpreter started before any member needs it (ADR 0240).

The agent keeps one (`--standby-runners`) waiting, started in its own session as a runner is. At START it
writes one line to the standby's stdin: a JSON object with the member directory and the runner's whole
environment for that member (its tag, its telemetry token). The standby then becomes that member's runner
as `python -m tuneplane.workers.runner --member-dir DIR` would have been: the environment replaced, the
member directory its working directory, stdout and stderr appended to `logs/runner.log`, stdin /dev/null.

It takes the member directory's lock at once (so an agent restarted from here on adopts it rather than
starting another), then waits for the agent's `go` line — written once the agent has reported the start
to the control plane, acknowledged or not — or for the end of its stdin (the agent is gone), at most
GATE_TIMEOUT seconds. Only then does it read the member and start the workload: a member's workload never
spends CPU before its start is reported, so on a busy node the reports of a gang's other members are not
slowed down by the members that started first (issue 23), and a committed member is never held back long.

What it saves is the interpreter start and the runner's imports (Python, the runner's modules, and
importlib.metadata for a pinned package check): 20-30 ms of CPU per member start, paid before the START.
It knows of no member until the START names one, so ADR 0110's rule holds: nothing of a member starts
before its COMMIT is recorded.

An end of file before any order (the agent exited or retired the standby) ends it with status 0 and
nothing written anywhere."""

from __future__ import annotations

import importlib.metadata  # noqa: F401 - paid here, before any member (see below)
import json
import os
import select
import sys
import time
from pathlib import Path

# Paid here, before any member: the runner's modules and what its runtime check imports when the job pins
# packages (importlib.metadata above, and the email package under it).
from tuneplane.workers.runner import process

ORDER_LIMIT = 4 * 1024 * 1024  # an environment is far smaller; a larger order is not one from the agent
GATE_TIMEOUT = 2.0


class BadOrder(Exception):
    pass


def read_order(data: bytes) -> tuple[Path, dict[str, str]]:
    """(member directory, environment) from the agent's order."""
    if len(data) > ORDER_LIMIT:
        raise BadOrder(f"order of {len(data)} bytes")
    try:
        order = json.loads(data)
    except ValueError as exc:
        raise BadOrder(f"not JSON ({exc})") from exc
    if not isinstance(order, dict):
        raise BadOrder("not an object")
    member_dir, env = order.get("member_dir"), order.get("env")
    if not isinstance(member_dir, str) or not Path(member_dir).is_dir():
        raise BadOrder(f"member_dir: {member_dir!r} is not a directory")
    strings = isinstance(env, dict) and all(isinstance(k, str) and isinstance(v, str) for k, v in env.items())
    if not strings:
        raise BadOrder("env: must be an object of strings")
    return Path(member_dir), env


def become(member_dir: Path, env: dict[str, str]) -> None:
    """Turn this process into the member's runner as the agent would have started it."""
    os.environ.clear()
    os.environ.update(env)
    os.chdir(member_dir)
    logs = member_dir / "logs"
    logs.mkdir(exist_ok=True)
    log = os.open(logs / "runner.log", os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    null = os.open(os.devnull, os.O_RDONLY)
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(null, 0)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.close(null)
    os.close(log)


def read_line(fd: int, limit: int) -> tuple[bytes, bytes]:
    """(the first line without its newline, what was read after it); the line is all that was read when
    the stream ended first. os.read rather than a buffered reader: what follows the order is the gate's."""
    data = b""
    while b"\n" not in data and len(data) <= limit:
        chunk = os.read(fd, 65536)
        if not chunk:
            return data, b""
        data += chunk
    line, _, rest = data.partition(b"\n")
    return line, rest


def wait_for_go(fd: int, already: bytes, timeout: float = GATE_TIMEOUT) -> str:
    """Until the agent's go line, the end of the stream (the agent is gone: nobody else will say), or
    `timeout`. Says which."""
    if b"\n" in already:
        return "go"
    deadline = time.monotonic() + timeout
    while (left := deadline - time.monotonic()) > 0:
        readable, _, _ = select.select([fd], [], [], left)
        if not readable:
            break
        chunk = os.read(fd, 64)
        if not chunk:
            return "agent gone"
        if b"\n" in chunk:
            return "go"
    return "timed out"


def serve() -> int:
    line, rest = read_line(0, ORDER_LIMIT)
    if not line.strip():
        return 0
    try:
        member_dir, env = read_order(line)
    except BadOrder as exc:
        print(f"standby runner: refused the agent's order: {exc}", file=sys.stderr, flush=True)
        return 2
    go = os.dup(0)  # the agent's go comes on the order's pipe; 0 becomes /dev/null
    become(member_dir, env)

    def gate() -> None:
        try:
            said = wait_for_go(go, rest)
        finally:
            os.close(go)
        if said != "go":
            print(f"the agent's go did not come ({said}); starting the member", flush=True)

    return process.run_member(member_dir, gate)
