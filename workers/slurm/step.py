"""The Slurm job step (`python -m tuneplane.workers.slurm.step launch ATTEMPT_DIR`), one task per node.

It holds no credential and decides nothing (ADR 0110): it verifies and unpacks the capsule the worker put on
the shared path as soon as the allocation starts (before the worker has even recorded it), then waits for
`plan.json` (the members the database recorded), prepares the member directory and reports PREPARED (or
the reason it failed) as a file under ATTEMPT_DIR/reports; it then waits for the `decision` file, which the
worker writes only after the database holds the decision, and only on `commit` starts `tuneplane runner`
for its member, reports it started, and records whether a signal it did not get from TunePlane reached it
(preemption, time limit). The worker turns each report into one stored-function call. The member is the
task's SLURM_NODEID (rank = node index of the allocation, the same order the worker gave
slurm_allocation_started). One step for prepare and run (ADR 0165): one srun and one interpreter per node
instead of two. `prepare` and `run` stay as modes for batch scripts written before it.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from tuneplane.workers.runner import runner_command

# Tests only: the prepare step of the member on this node fails (one prepare failure on one node).
FAIL_PREPARE_ENV = "TUNEPLANE_SLURM_TEST_FAIL_PREPARE_ON"
# Tests only: "NODE:SECONDS": the member on NODE starts its runner SECONDS after the decision (a slow node).
DELAY_START_ENV = "TUNEPLANE_SLURM_TEST_DELAY_START_ON"


def report(attempt_dir: Path, rank: int, kind: str, body: dict) -> None:
    reports = attempt_dir / "reports"
    reports.mkdir(exist_ok=True)
    tmp = reports / f".{rank}.{kind}.tmp"
    tmp.write_text(json.dumps(body))
    os.replace(tmp, reports / f"{rank}.{kind}")


# How often a step looks for a file the worker writes (plan.json, decision): every 20 ms for the first
# 2 s (the worker answers a report within milliseconds), then every 0.2 s (a worker that is away).
FAST_LOOKS = 100
FAST_LOOK_S = 0.02
SLOW_LOOK_S = 0.2


def wait_for_file(path: Path) -> str:
    """The file's text once the worker wrote it (it renames a finished file into place). No bound: the
    job's time limit and scancel end a step whose worker never answers."""
    looks = 0
    while True:
        try:
            return path.read_text().strip()
        except FileNotFoundError:
            time.sleep(FAST_LOOK_S if looks < FAST_LOOKS else SLOW_LOOK_S)
            looks += 1


def prepare(attempt_dir: Path, rank: int) -> int:
    from tuneplane.workers.artifacts.materialize import MaterializeError, materialize_shared
    from tuneplane.workers.capsule import CapsuleError, unpack_capsule
    from tuneplane.workers.member_setup import MEMBER_FIELDS, PrepareFailed, unpack_source
    from tuneplane.workers.runner.runtime import RuntimeRefused, check_runtime

    refused = (PrepareFailed, CapsuleError, RuntimeRefused, MaterializeError)
    directory = attempt_dir / "members" / str(rank)
    node = os.environ.get("SLURMD_NODENAME", "")
    try:
        if os.environ.get(FAIL_PREPARE_ENV) == node:
            raise PrepareFailed(f"test hook {FAIL_PREPARE_ENV} names this node")
        directory.mkdir(parents=True, exist_ok=True)
        # The capsule is known before the allocation is recorded (capsule_digest, written before sbatch):
        # its verification and unpacking overlap the worker's handling of the allocation.
        digest = (attempt_dir / "capsule_digest").read_text().strip()
        if not (directory / "capsule" / "manifest.json").is_file():
            tar = attempt_dir.parent.parent / "capsules" / f"{digest}.tar"
            unpack_capsule(tar, digest, directory / "capsule")
        spec = json.loads((directory / "capsule" / "spec.json").read_text())
        unpack_source(spec, directory)
        if spec.get("inputs"):
            raise PrepareFailed("inputs are not delivered on Slurm fleets yet (docs/slurm.md)")
        check_runtime(spec.get("runtime") or {})
        plan = json.loads(wait_for_file(attempt_dir / "plan.json"))
        if plan["capsule_digest"] != digest:
            raise PrepareFailed(f"plan.json names capsule {plan['capsule_digest']}, not {digest}")
        member = plan["members"][rank]
        if plan.get("resume"):
            # The verified checkpoint this attempt resumes from ($TUNEPLANE_RESUME_DIR, docs/preemption.md):
            # copied from where it lies on the shared path and verified against its pinned manifest.
            pinned = {**plan["resume"], "name": f"resume ({plan['resume']['name']})"}
            materialize_shared(pinned, plan["resume_manifest"], directory / "resume")
        config = {key: member.get(key, plan.get(key)) for key in MEMBER_FIELDS}
        config.update(local_rank=0, node_rank=rank, simulated_gpus=False, node=node)
        (directory / "output").mkdir(exist_ok=True)
        (directory / "logs").mkdir(exist_ok=True)
        tmp = directory / "member.json.tmp"
        tmp.write_text(json.dumps(config, indent=2))
        os.replace(tmp, directory / "member.json")
    except (*refused, OSError, ValueError, KeyError, IndexError) as exc:
        report(attempt_dir, rank, "prepare_failed", {"node": node, "reason": str(exc)})
        return 1
    report(attempt_dir, rank, "prepared", {"node": node})
    return 0


def launch(attempt_dir: Path, rank: int) -> int:
    """Prepare, then run the member only after the worker wrote the recorded decision `commit`."""
    if prepare(attempt_dir, rank) != 0:
        return 1
    decision = wait_for_file(attempt_dir / "decision")
    if decision != "commit":
        print(f"tuneplane: launch aborted (decision {decision!r})", flush=True)
        return 1
    return run(attempt_dir, rank)


def run(attempt_dir: Path, rank: int) -> int:
    from tuneplane.workers.proctree import TAG_VARIABLE

    plan = json.loads((attempt_dir / "plan.json").read_text())
    member = plan["members"][rank]
    directory = attempt_dir / "members" / str(rank)
    env = dict(os.environ)
    env[TAG_VARIABLE] = f"m{member['member_id']}.slurm{plan['attempt_id']}"
    node, _, delay = os.environ.get(DELAY_START_ENV, "").partition(":")
    if node and node == os.environ.get("SLURMD_NODENAME"):
        time.sleep(float(delay))
    started: dict[str, subprocess.Popen] = {}

    def forward(signum: int, _frame: object) -> None:
        # Slurm signals the step on scancel (TunePlane's cancel, its request to checkpoint and stop:
        # `scancel --signal`), its own preemption or time limit; whether TunePlane asked for it is the
        # database's call (slurm_member_exited): this records only that it happened, and when.
        report(attempt_dir, rank, "signalled", {"signal": signum, "at": time.time()})
        if "runner" in started:
            with contextlib.suppress(ProcessLookupError):
                started["runner"].send_signal(signum)

    # Before the runner starts: every signal a job may choose for its preemption reaches this process too,
    # and none may end it (the step would end and Slurm would kill the workload with it).
    for sig in STEP_SIGNALS:
        signal.signal(sig, forward)
    collector = start_collector(plan, member, directory, env)
    runner = subprocess.Popen(
        runner_command(directory),
        env=env,
        stdout=open(directory / "logs" / "runner.log", "ab"),  # noqa: SIM115 - the child's
        stderr=subprocess.STDOUT,
    )
    started["runner"] = runner
    report(attempt_dir, rank, "started", {"pid": runner.pid, "node": os.environ.get("SLURMD_NODENAME")})
    while True:
        try:
            code = runner.wait()
            break
        except InterruptedError:
            continue
    # Wakes the worker (ADR 0165): the keeper has written exit_status.json, which the worker records at
    # once; the collector's drain below does not hold the member's end.
    report(attempt_dir, rank, "exited", {"exit_code": code})
    if collector is not None:
        drain_collector(*collector)
    return code


# Signals that reach the step: TunePlane's cancel (SIGTERM), a request to checkpoint and stop (the job's
# preemption.signal), Slurm's own preemption and time limit.
STEP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2)


def spool_dir(plan: dict, member: dict) -> Path:
    """The collector's spool: private and host-local (never the shared path, which is a network FS)."""
    base = Path(os.environ.get("TMPDIR") or "/tmp") / "tuneplane-slurm-spool"
    # Unique per installation and attempt (job and member ids repeat across installations on one host).
    where = hashlib.sha256(plan["capsule_tar"].encode() + str(plan["attempt_id"]).encode()).hexdigest()[:16]
    return base / f"j{plan['job_id']}-a{plan['attempt']}-m{member['member_id']}-{where}"


def start_collector(plan: dict, member: dict, directory: Path, env: dict) -> tuple | None:
    """The member's collector beside it, shipping to the telemetry gateway with the member-scoped token the
    worker issued at COMMIT (telemetry.token in the member directory, 0600). None without one."""
    from tuneplane.workers.proctree import TAG_VARIABLE, stop_signals_blocked

    url = plan.get("telemetry_url")
    token_file = directory / "telemetry.token"
    if not url or not token_file.is_file():
        return None
    token = token_file.read_text().strip()
    spool = spool_dir(plan, member)
    spool.mkdir(parents=True, exist_ok=True, mode=0o700)
    env["TUNEPLANE_TELEMETRY_URL"] = url
    env["TUNEPLANE_TELEMETRY_TOKEN"] = token
    argv = [
        sys.executable, "-P", "-m", "tuneplane", "collector", "--output-dir", str(directory / "output"),
        "--spool-dir", str(spool), "--gateway", url,
        "--collector-id", f"slurm-{os.environ.get('SLURMD_NODENAME', 'node')}-m{member['member_id']}",
        "--job-id", str(plan["job_id"]), "--attempt", str(plan["attempt"]), "--member", str(member["rank"]),
        "--member-tag", env[TAG_VARIABLE],
        "--gpus", ",".join(str(g) for g in member.get("gpu_indices") or []),
        # scancel's signals reach every process of the step, this one too: only the step asks it to drain.
        "--drain-signal", "SIGRTMIN",
    ]  # fmt: skip
    with stop_signals_blocked():
        process = subprocess.Popen(
            argv,
            env={**env, "TUNEPLANE_TELEMETRY_TOKEN": token},
            stdin=subprocess.DEVNULL,
            stdout=open(directory / "logs" / "collector.log", "ab"),  # noqa: SIM115 - the child's
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    return process, spool


def drain_collector(process: subprocess.Popen, spool: Path, timeout: float = 60.0) -> bool:
    """The member ended: the collector reads every file to its end and sends its final batch (the member's
    metrics become complete), bounded; as the node agent does (workers/agent/collectors.py)."""
    from tuneplane.workers.collector.markers import EXIT_GRACE, FINAL_SENT, MEMBER_EXITED

    (spool / MEMBER_EXITED).write_text(f"{time.time()}\n")
    try:
        process.send_signal(signal.SIGRTMIN)  # its --drain-signal (start_collector)
    except ProcessLookupError:
        pass
    deadline = time.monotonic() + timeout
    while not (spool / FINAL_SENT).exists() and time.monotonic() < deadline and process.poll() is None:
        time.sleep(0.05)
    if (spool / FINAL_SENT).exists():  # its work is done: EXIT_GRACE to exit, then it is killed (ADR 0165)
        deadline = min(deadline, time.monotonic() + EXIT_GRACE)
    try:
        process.wait(max(0.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        process.kill()
    if (spool / FINAL_SENT).exists():
        shutil.rmtree(spool, ignore_errors=True)  # everything was acknowledged: nothing left to resend
        return True
    return False


def main(argv: list[str]) -> int:
    mode, attempt_dir = argv[0], Path(argv[1])
    rank = int(os.environ["SLURM_NODEID"])
    if mode == "prepare":
        return prepare(attempt_dir, rank)
    if mode == "run":
        return run(attempt_dir, rank)
    if mode == "launch":
        return launch(attempt_dir, rank)
    raise SystemExit(f"unknown step {mode!r}")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
