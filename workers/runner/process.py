"""One member's run: check the runtime, start the workload, keep its logs, write its exit status.

The runner first takes an exclusive lock (flock) on `<member-dir>/runner.lock` and keeps it until the
member has ended: a second runner for the same member directory refuses at once (without touching the
exit status), and the agent tells a live run from a finished one by whether the lock is held.

It then forks a *keeper*: the workload's parent and the one process that learns its exit status. The
keeper is a child subreaper (prctl), so whatever the workload starts stays below it even when an
intermediate process exits; on SIGTERM (the agent's stop) it passes the signal to every descendant and
keeps waiting, so the exit status it writes is the workload's. When the workload's main process ends,
leftover descendants get SIGTERM and, 5 s later, SIGKILL — unless a stop or a preemption is under way and
the main process was ended by a signal: then it was a shell (`/bin/sh -c "python train.py"`, which dash
runs as a child) that the signal ended while its program, orphaned to the keeper, is still saving its
checkpoint. The keeper waits for every such process, with no deadline of its own (the agent's SIGKILL at
the end of the grace is the deadline), and writes the exit status of the last of them: the program's.
The runner itself only waits for the keeper: a `kill -9` of the runner leaves the keeper (it inherited the
lock) to finish, so the workload's real exit status is still written and a killed runner is not a failed
workload. `runner.json` names both pids.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from tuneplane.workers.proctree import descendants, signal_all, signal_name, start_time
from tuneplane.workers.runner.environment import MemberPaths, build_launch
from tuneplane.workers.runner.runtime import RuntimeRefused, check_runtime

REFUSED_EXIT = 126
# Another runner holds this member directory: nothing was started, nothing was written.
LOCKED_EXIT = 125
PR_SET_CHILD_SUBREAPER = 36
# Signals a job may choose for its preemption (JobSpec preemption.signal) that stop nothing of TunePlane's.
# Handled, never SIG_IGN: an ignored signal stays ignored across exec, and the workload must start with
# every disposition at its default (a job whose preemption signal is SIGHUP relies on it).
PREEMPTION_ONLY = (signal.SIGUSR1, signal.SIGUSR2, signal.SIGHUP)
# Copies of one preemption signal reaching the keeper within this many seconds are one request.
PREEMPTION_REPEAT_WINDOW = 5.0
LOCK_FILE = "runner.lock"
# Under the member's output directory: written by the agent's PREEMPT (workers/agent/checkpoints.py's
# control directory; the runner does not import the agent).
PREEMPT_REQUEST = ".tuneplane/preempt.json"
PIDS_FILE = "runner.json"
# The agent probes the lock (a shared lock for an instant): the runner retries its exclusive lock a while.
LOCK_WAIT = 3.0


def take_member_lock(member_dir: Path, wait: float = LOCK_WAIT) -> int | None:
    """The open lock file descriptor with an exclusive flock held, or None if another process holds it."""
    fd = os.open(member_dir / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
    deadline = time.monotonic() + wait
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return fd
        except OSError as exc:
            if exc.errno not in (errno.EAGAIN, errno.EACCES) or time.monotonic() >= deadline:
                os.close(fd)
                return None
            time.sleep(0.05)


def member_lock_held(member_dir: Path) -> bool:
    """True while a runner (or its keeper) of this member directory is alive: it holds the lock."""
    try:
        fd = os.open(member_dir / LOCK_FILE, os.O_RDONLY)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError:
        return True
    finally:
        os.close(fd)  # closing drops the shared lock if we got it
    return False


def read_runner_pids(member_dir: Path) -> dict:
    """{"runner": pid, "keeper": pid, "keeper_started": ticks} as the runner wrote them, or {}."""
    try:
        return json.loads((member_dir / PIDS_FILE).read_text())
    except (OSError, ValueError):
        return {}


def write_exit_status(
    paths: MemberPaths, exit_code: int, reason: str, started_at: float | None = None
) -> None:
    """`started_at`: when the workload's process was started (the launch bench's START → workload started)."""
    tmp = paths.exit_status.with_name(paths.exit_status.name + ".tmp")
    status = {"exit_code": exit_code, "reason": reason, "ended_at": time.time()}
    if started_at is not None:
        status["started_at"] = started_at
    with open(tmp, "w") as handle:
        json.dump(status, handle)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, paths.exit_status)


def read_exit_status(member_dir: Path) -> dict | None:
    try:
        return json.loads((member_dir / "exit_status.json").read_text())
    except (OSError, ValueError):
        return None


def describe_exit(code: int, stopped: bool, env: dict[str, str] | None = None) -> str:
    """A stop names who sent it (`stopped_by`)."""
    who = stopped_by(env)
    if code == 0:
        return "exited with status 0"
    if code < 0:
        what = f"killed by {signal_name(-code)}"
        return what + (f" (stopped by {who})" if stopped else "")
    return f"exited with status {code}" + (f" after {who}'s stop" if stopped else "")


def stopped_by(env: dict[str, str] | None = None) -> str:
    """The node agent, or Slurm inside a Slurm step (its scancel reaches the keeper; no agent runs there)."""
    return "Slurm" if (os.environ if env is None else env).get("SLURM_JOB_ID") else "the agent"


def _become_subreaper() -> None:
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)


def run_member(member_dir: Path, gate: Callable[[], None] | None = None) -> int:
    """`gate`: called once the member directory's lock is held, before anything of the member is read or
    started (a standby runner waits there for the agent's go, standby.py)."""
    paths = MemberPaths(Path(member_dir).resolve())
    lock = take_member_lock(paths.root)
    if lock is None:
        holder = read_runner_pids(paths.root)
        print(f"another runner holds this member directory ({holder}); not starting it again", flush=True)
        return LOCKED_EXIT
    if gate is not None:
        gate()
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
        container_runtime = check_runtime(spec.get("runtime") or {}, member)
    except RuntimeRefused as exc:
        return refuse(str(exc))
    launch = build_launch(member, spec, manifest, paths, dict(os.environ), container_runtime)
    print(f"starting member {member['member_id']} rank {member['rank']}: {' '.join(launch.argv)}", flush=True)

    keeper = os.fork()
    if keeper == 0:  # the keeper: runs the workload, writes its exit status (it inherited the lock)
        code = 0
        try:
            code = _keep(paths, member, launch, stdout_log, stderr_log)
        except BaseException as exc:  # never return into the runner's code in the forked child
            with contextlib.suppress(Exception):
                write_exit_status(paths, REFUSED_EXIT, f"the runner's keeper failed: {exc!r}")
            code = REFUSED_EXIT
        finally:
            sys.stdout.flush()
            os._exit(code)
    _write_pids(paths, keeper)

    def forward(signum: int, _frame: object) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(keeper, signum)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    # A job's preemption signal (SIGUSR1/SIGUSR2/SIGHUP, docs/preemption.md) is the workload's. The node agent
    # never sends it here, but Slurm's `scancel --signal` reaches every process of the job step: it must
    # not end the runner (their default action), and it goes on to the workload as SIGTERM does.
    for sig in PREEMPTION_ONLY:
        signal.signal(sig, forward)
    while True:
        try:
            _, status = os.waitpid(keeper, 0)
            return os.waitstatus_to_exitcode(status)
        except InterruptedError:
            continue
        except ChildProcessError:
            return 0


def _write_pids(paths: MemberPaths, keeper: int) -> None:
    pids = {
        "runner": os.getpid(),
        "runner_started": start_time(os.getpid()),
        "keeper": keeper,
        "keeper_started": start_time(keeper),
    }
    tmp = paths.root / (PIDS_FILE + ".tmp")
    tmp.write_text(json.dumps(pids))
    os.replace(tmp, paths.root / PIDS_FILE)


def _keep(paths: MemberPaths, member: dict, launch, stdout_log, stderr_log) -> int:
    _become_subreaper()
    stop_requested = {"signal": 0}

    def forward(signum: int, _frame: object) -> None:
        stop_requested["signal"] = signum
        signal_all(descendants(os.getpid()), signum)

    passed_on: dict[int, float] = {}

    def pass_on(signum: int, _frame: object) -> None:
        # A preemption signal asks the workload to checkpoint; it is no stop of the keeper's (the handler,
        # unlike SIG_IGN, is not inherited by the workload: it gets the default action or its own trap).
        # One request reaches the keeper more than once (Slurm's `scancel --signal` signals the runner,
        # which forwards it, and the keeper alike): a repeat within PREEMPTION_REPEAT_WINDOW is the same
        # request, not passed on again. A workload that saved and is exiting has its handlers reset by
        # the interpreter's shutdown, and a second copy would then kill it ("killed by SIGUSR1").
        now = time.monotonic()
        if now - passed_on.get(signum, -PREEMPTION_REPEAT_WINDOW) < PREEMPTION_REPEAT_WINDOW:
            return
        passed_on[signum] = now
        signal_all(descendants(os.getpid()), signum)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    for sig in PREEMPTION_ONLY:
        signal.signal(sig, pass_on)
    try:
        child = subprocess.Popen(
            launch.argv,
            cwd=launch.cwd,
            env=launch.env,
            stdin=subprocess.DEVNULL,
            stdout=stdout_log,
            stderr=stderr_log,
        )
        started_at = time.time()
    except OSError as exc:
        stderr_log.write(f"tuneplane runner: cannot start {launch.argv[0]}: {exc}\n".encode())
        stderr_log.flush()
        write_exit_status(
            paths, REFUSED_EXIT, f"runner refused to start: cannot start {launch.argv[0]}: {exc}"
        )
        return REFUSED_EXIT
    code = _wait_for(child.pid)
    if code < 0 and (stop_requested["signal"] or _preemption_requested(paths)):
        code = _wait_for_orphans(code)
    _clean_up_leftovers()
    if launch.cleanup:  # e.g. the member's container (workers/runner/containers.py)
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            subprocess.run(launch.cleanup, env=launch.env, capture_output=True, timeout=60, check=False)
    reason = describe_exit(code, bool(stop_requested["signal"]))
    write_exit_status(paths, code, reason, started_at)
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


def _preemption_requested(paths: MemberPaths) -> bool:
    """The agent's PREEMPT wrote its request file (workers/agent/preemption.py) before it signalled the
    workload; the keeper itself is not signalled then."""
    return (paths.output / PREEMPT_REQUEST).is_file()


def _wait_for_orphans(main_code: int) -> int:
    """Reap every process left below the keeper until none is: the exit status of the last one to end
    (the program a killed shell left behind), or `main_code` when there was none."""
    code = main_code
    while True:
        try:
            _, status = os.wait()
        except ChildProcessError:
            return code
        code = os.waitstatus_to_exitcode(status)


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
