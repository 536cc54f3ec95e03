"""One member's run: check the runtime, start the workload, keep its logs, write its exit status.

The runner is a child subreaper (prctl), so whatever the workload starts stays below it even when an
intermediate process exits; on SIGTERM (the agent's stop) it passes the signal to every descendant and
keeps waiting, so the exit status it writes is the workload's. When the workload's main process ends,
leftover descendants get SIGTERM and, 5 s later, SIGKILL: nothing of a member outlives its runner.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from workers.proctree import descendants, signal_all, signal_name
from workers.runner.environment import MemberPaths, build_launch
from workers.runner.runtime import RuntimeRefused, check_runtime

REFUSED_EXIT = 126
PR_SET_CHILD_SUBREAPER = 36


def write_exit_status(paths: MemberPaths, exit_code: int, reason: str) -> None:
    tmp = paths.exit_status.with_name(paths.exit_status.name + ".tmp")
    with open(tmp, "w") as handle:
        json.dump({"exit_code": exit_code, "reason": reason, "ended_at": time.time()}, handle)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, paths.exit_status)


def read_exit_status(member_dir: Path) -> dict | None:
    try:
        return json.loads((member_dir / "exit_status.json").read_text())
    except (OSError, ValueError):
        return None


def describe_exit(code: int, stopped: bool) -> str:
    if code == 0:
        return "exited with status 0"
    if code < 0:
        what = f"killed by {signal_name(-code)}"
        return what + (" (stopped by the agent)" if stopped else "")
    return f"exited with status {code}" + (" after the agent's stop" if stopped else "")


def _become_subreaper() -> None:
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)


def run_member(member_dir: Path) -> int:
    paths = MemberPaths(Path(member_dir).resolve())
    paths.logs.mkdir(parents=True, exist_ok=True)
    paths.output.mkdir(parents=True, exist_ok=True)
    stdout_log = open(paths.logs / "stdout.log", "ab")  # noqa: SIM115 - handed to the child
    stderr_log = open(paths.logs / "stderr.log", "ab")  # noqa: SIM115

    def refuse(message: str) -> int:
        stderr_log.write(f"tuneplane runner: {message}\n".encode())
        stderr_log.flush()
        print(f"refused: {message}", flush=True)
        write_exit_status(paths, REFUSED_EXIT, f"runner refused to start: {message}")
        return REFUSED_EXIT

    if paths.exit_status.exists():
        # A member runs once: a second runner for the same member directory starts nothing.
        print("this member already ran (exit_status.json exists); not starting it again", flush=True)
        return REFUSED_EXIT
    try:
        member = json.loads(paths.config.read_text())
        spec = json.loads((paths.capsule / "spec.json").read_text())
        manifest = json.loads((paths.capsule / "manifest.json").read_text())
    except (OSError, ValueError) as exc:
        return refuse(f"the member directory is not prepared ({exc})")
    try:
        container_runtime = check_runtime(spec.get("runtime") or {})
    except RuntimeRefused as exc:
        return refuse(str(exc))
    launch = build_launch(member, spec, manifest, paths, dict(os.environ), container_runtime)

    _become_subreaper()
    stop_requested = {"signal": 0}

    def forward(signum: int, _frame: object) -> None:
        stop_requested["signal"] = signum
        signal_all(descendants(os.getpid()), signum)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    print(f"starting member {member['member_id']} rank {member['rank']}: {' '.join(launch.argv)}", flush=True)
    try:
        child = subprocess.Popen(
            launch.argv,
            cwd=launch.cwd,
            env=launch.env,
            stdin=subprocess.DEVNULL,
            stdout=stdout_log,
            stderr=stderr_log,
        )
    except OSError as exc:
        return refuse(f"cannot start {launch.argv[0]}: {exc}")
    code = _wait_for(child.pid)
    _clean_up_leftovers()
    reason = describe_exit(code, bool(stop_requested["signal"]))
    write_exit_status(paths, code, reason)
    print(f"member {member['member_id']} {reason}", flush=True)
    return 0


def _wait_for(main_pid: int) -> int:
    """Reap children (orphans reparented to us too) until the workload's main process ends."""
    while True:
        try:
            pid, status = os.wait()
        except ChildProcessError:
            return -signal.SIGKILL  # nothing left to wait for: should not happen
        if pid == main_pid:
            return os.waitstatus_to_exitcode(status)


def _clean_up_leftovers(grace: float = 5.0) -> None:
    left = descendants(os.getpid())
    if not left:
        return
    signal_all(left, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        with contextlib.suppress(ChildProcessError):
            while os.waitpid(-1, os.WNOHANG)[0] > 0:
                pass
        if not descendants(os.getpid()):
            return
        time.sleep(0.05)
    signal_all(descendants(os.getpid()), signal.SIGKILL)
    with contextlib.suppress(ChildProcessError):
        while os.waitpid(-1, 0)[0] > 0:
            pass


def main(member_dir: str) -> None:
    sys.exit(run_member(Path(member_dir)))
