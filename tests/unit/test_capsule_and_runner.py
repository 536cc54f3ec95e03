"""The Job Capsule (deterministic, verified on the node) and the runner (runtime pin, environment, exit
status file), with real files and a real runner subprocess; no database."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from tests.e2e.launch_cluster import source_archive
from tests.helpers import wait_for
from tuneplane.app.blobstore import FilesystemBlobStore
from tuneplane.app.submission.pins import artifact_pin, integrations, python_runtime_pin
from tuneplane.workers.backend.capsule_build import build_capsule
from tuneplane.workers.capsule import CapsuleError, unpack_capsule
from tuneplane.workers.runner.environment import MemberPaths, build_launch, workload_environment
from tuneplane.workers.runner.process import LOCKED_EXIT, member_lock_held, read_runner_pids
from tuneplane.workers.runner.runtime import RuntimeRefused, check_runtime, python_pin_problems

SCRIPT = """import os, sys
print("hello from rank", os.environ["RANK"])
sys.exit(int(os.environ.get("EXIT", "0")))
"""


def _store_archive(blobs: FilesystemBlobStore, data: bytes) -> str:
    import hashlib

    sha = hashlib.sha256(data).hexdigest()
    with blobs.stage() as (staged, handle):
        handle.write(data)
        handle.flush()
        blobs.commit_staged(staged, sha)
    return sha


def _spec(sha: str, integration: str = "script") -> dict:
    plugin = integrations()[integration]
    runtime, _ = python_runtime_pin(plugin)
    return {
        "schema": "tuneplane.preview/v1",
        "input": {"kind": "source", "archive": {"sha256": sha}, "entrypoint": "python main.py",
                  "integration": integration},
        "integration": artifact_pin(plugin),
        "runtime": runtime,
        "resources": {"nodes": 1, "gpus_per_node": 0, "cpus_per_node": 1, "memory_per_node": 0},
        "env": {"EXIT": "0"},
        "inputs": [],
        "outputs": [],
    }  # fmt: skip


@pytest.fixture
def built(tmp_path: Path) -> tuple[FilesystemBlobStore, dict, str]:
    blobs = FilesystemBlobStore(tmp_path / "blobs")
    sha = _store_archive(blobs, source_archive({"main.py": SCRIPT}))
    spec = _spec(sha)
    return blobs, spec, build_capsule(spec, blobs)


def test_the_same_spec_gives_the_same_capsule_digest(built, tmp_path: Path) -> None:
    blobs, spec, digest = built
    assert build_capsule(spec, blobs) == digest
    other = FilesystemBlobStore(tmp_path / "elsewhere")
    _store_archive(other, source_archive({"main.py": SCRIPT}))
    assert build_capsule(spec, other) == digest
    changed = {**spec, "env": {"EXIT": "1"}}
    assert build_capsule(changed, blobs) != digest


def test_a_capsule_verifies_and_unpacks_with_its_manifest(built, tmp_path: Path) -> None:
    blobs, _spec, digest = built
    manifest = unpack_capsule(blobs.path(digest), digest, tmp_path / "capsule")
    assert manifest["integration"]["entry"] == "integration/script.py"
    assert json.loads((tmp_path / "capsule" / "spec.json").read_text())["env"] == {"EXIT": "0"}
    assert (tmp_path / "capsule" / "source" / "archive.tar.gz").is_file()
    assert {f["path"] for f in manifest["files"]} == {
        "integration/script.py", "runtime.json", "source/archive.tar.gz", "spec.json"}  # fmt: skip


def test_a_capsule_with_other_bytes_than_its_digest_is_refused(built, tmp_path: Path) -> None:
    blobs, _spec, digest = built
    tampered = tmp_path / "tampered.tar"
    data = bytearray(blobs.path(digest).read_bytes())
    data[700] ^= 0x01
    tampered.write_bytes(bytes(data))
    with pytest.raises(CapsuleError, match="digest mismatch"):
        unpack_capsule(tampered, digest, tmp_path / "capsule")
    assert not (tmp_path / "capsule").exists()


def test_a_consistent_capsule_with_a_swapped_integration_is_refused(built, tmp_path: Path) -> None:
    """Even a capsule whose manifest matches its bytes is refused when the integration is not the pin."""
    from tuneplane.workers.capsule import bytes_entry, spec_entries, write_capsule

    blobs, spec, _digest = built
    entries = [*spec_entries(spec), bytes_entry("integration/script.py", b"import os\nos.system('evil')\n")]
    entries.append(
        bytes_entry("source/archive.tar.gz", blobs.path(spec["input"]["archive"]["sha256"]).read_bytes())
    )
    path = tmp_path / "swapped.tar"
    with open(path, "wb") as out:
        write_capsule(spec, entries, out)
    import hashlib

    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    with pytest.raises(CapsuleError, match="differs from the artifact pinned"):
        unpack_capsule(path, digest, tmp_path / "capsule")


def test_a_worker_whose_integration_differs_from_the_pin_cannot_build(built) -> None:
    blobs, spec, _digest = built
    spec = json.loads(json.dumps(spec))
    spec["integration"]["files"]["script.py"] = "0" * 64
    with pytest.raises(CapsuleError):
        build_capsule(spec, blobs)


def test_python_pin_mismatches_are_named() -> None:
    pin = {"kind": "python", "implementation": sys.implementation.name, "python": "2.7",
           "packages": {"pytest": "0.0.1", "surely-not-installed-pkg": "1.0", "numpy": None}}  # fmt: skip
    problems = python_pin_problems(pin)
    assert any("python 2.7 pinned" in p for p in problems)
    assert any(p.startswith("pytest 0.0.1 pinned,") for p in problems)
    assert any("surely-not-installed-pkg 1.0 pinned, not installed" in p for p in problems)
    assert not any("numpy" in p for p in problems)
    with pytest.raises(RuntimeRefused, match="pinned Python runtime"):
        check_runtime(pin)


def test_an_image_pin_without_a_container_runtime_is_refused_not_run_on_the_host(
    monkeypatch, tmp_path
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # an empty PATH: no podman, no docker
    with pytest.raises(RuntimeRefused, match="never run on the host"):
        check_runtime({"kind": "image", "image": "docker.io/library/python:3.11@sha256:" + "a" * 64})


def test_the_workload_environment_has_the_member_variables_and_no_credentials(tmp_path: Path) -> None:
    member = {"member_id": 7, "rank": 1, "world_size": 2, "master_addr": "10.0.0.1", "master_port": 29501,
              "job_id": 3, "attempt": 2, "gpu_indices": [2, 3]}  # fmt: skip
    spec = {"input": {"kind": "source", "entrypoint": "python t.py"}, "env": {"MY_VAR": "x"},
            "resources": {"gpus_per_node": 2}}  # fmt: skip
    inherited = {"PATH": "/usr/bin", "TUNEPLANE_DATABASE_URL": "postgresql://secret",
                 "TUNEPLANE_NODE_CREDENTIAL": "tpn_secret", "TUNEPLANE_ENROLL_TOKEN": "tpe_x",
                 "TUNEPLANE_TOKEN": "tpu_x", "TUNEPLANE_TELEMETRY_TOKEN": "tpt_ok",
                 "TUNEPLANE_TELEMETRY_URL": "http://t", "PGPASSWORD": "pw"}  # fmt: skip
    env = workload_environment(member, spec, MemberPaths(tmp_path), inherited)
    assert {k: env[k] for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "NODE_RANK", "MASTER_ADDR", "MASTER_PORT",
                                "TUNEPLANE_JOB_ID", "TUNEPLANE_ATTEMPT")} == {
        "RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "NODE_RANK": "1", "MASTER_ADDR": "10.0.0.1",
        "MASTER_PORT": "29501", "TUNEPLANE_JOB_ID": "3", "TUNEPLANE_ATTEMPT": "2"}  # fmt: skip
    assert env["TUNEPLANE_OUTPUT_DIR"] == str(tmp_path / "output")
    assert env["CUDA_VISIBLE_DEVICES"] == "2,3" and env["MY_VAR"] == "x"
    # CUDA numbers the GPUs as NVML (the agent, the collector) does, not fastest-first.
    assert env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    assert env["TUNEPLANE_TELEMETRY_TOKEN"] == "tpt_ok"
    for secret in ("TUNEPLANE_DATABASE_URL", "TUNEPLANE_NODE_CREDENTIAL", "TUNEPLANE_ENROLL_TOKEN",
                   "TUNEPLANE_TOKEN", "PGPASSWORD"):  # fmt: skip
        assert secret not in env
    assert not any(v.startswith(("tpn_", "tpe_", "tpu_")) for v in env.values())


@pytest.mark.skipif(sys.prefix == sys.base_prefix, reason="the runner runs from a virtual environment here")
def test_a_scripts_python_is_the_runners_validated_interpreter_not_the_first_on_path(tmp_path: Path) -> None:
    """The pin was checked against the runner's interpreter; `python job.py` in a script must be it (CI
    found a system python without tuneplane's SDK first on PATH)."""
    decoy = tmp_path / "decoy"
    decoy.mkdir()
    (decoy / "python").write_text("#!/bin/sh\necho decoy\n")
    (decoy / "python").chmod(0o755)
    member = {"rank": 0, "world_size": 1, "master_addr": "127.0.0.1", "master_port": 1, "job_id": 1,
              "attempt": 1}  # fmt: skip
    spec = {"input": {"kind": "source", "entrypoint": "python job.py"}}
    manifest = {"integration": {"entry": "integration/script.py"}}
    paths = MemberPaths(tmp_path)
    launch = build_launch(member, spec, manifest, paths, {"PATH": f"{decoy}:/usr/bin:/bin"}, None)
    out = subprocess.run(
        ["sh", "-c", "python -c 'import sys; print(sys.prefix)'"],
        env=launch.env, capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    assert out == sys.prefix


def _prepared_member(built, tmp_path: Path, exit_code: int = 0, entrypoint: str | None = None) -> Path:
    blobs, spec, _ = built
    spec = {**spec, "env": {"EXIT": str(exit_code)}}
    if entrypoint:
        spec = {**spec, "input": {**spec["input"], "entrypoint": entrypoint}}
    digest = build_capsule(spec, blobs)
    root = tmp_path / "member"
    root.mkdir()
    unpack_capsule(blobs.path(digest), digest, root / "capsule")
    with tarfile.open(root / "capsule" / "source" / "archive.tar.gz") as tar:
        tar.extractall(root / "src", filter="data")
    (root / "member.json").write_text(json.dumps({
        "member_id": 1, "rank": 0, "world_size": 1, "master_addr": "127.0.0.1", "master_port": 29999,
        "job_id": 1, "attempt": 1, "gpu_indices": []}))  # fmt: skip
    return root


def _run(root: Path, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-P", "-m", "tuneplane", "runner", "--member-dir", str(root)],
                          env={**os.environ, **env}, capture_output=True, text=True, timeout=60)  # fmt: skip


def test_the_runner_runs_the_member_keeps_its_logs_and_writes_its_exit_status(built, tmp_path: Path) -> None:
    root = _prepared_member(built, tmp_path, exit_code=3)
    done = _run(root, TUNEPLANE_NODE_CREDENTIAL="tpn_must_not_leak")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "hello from rank 0" in (root / "logs" / "stdout.log").read_text()
    status = json.loads((root / "exit_status.json").read_text())
    assert status["exit_code"] == 3 and status["reason"] == "exited with status 3"
    # A second runner for the same member starts nothing.
    again = _run(root)
    assert again.returncode != 0 and "already ran" in again.stdout
    assert (root / "logs" / "stdout.log").read_text().count("hello from rank 0") == 1


def test_the_runner_refuses_a_runtime_it_cannot_honour_and_says_why_in_the_logs(
    built, tmp_path: Path
) -> None:
    root = _prepared_member(built, tmp_path)
    spec_path = root / "capsule" / "spec.json"
    spec = json.loads(spec_path.read_text())
    spec["runtime"] = {**spec["runtime"], "python": "3.99"}
    spec_path.write_text(json.dumps(spec))
    _run(root)
    status = json.loads((root / "exit_status.json").read_text())
    assert status["exit_code"] == 126 and "python 3.99 pinned" in status["reason"]
    assert "tuneplane runner: the pinned Python runtime" in (root / "logs" / "stderr.log").read_text()
    assert not (root / "logs" / "stdout.log").read_text()


DISPOSITIONS = """import json, os, pathlib, signal
out = pathlib.Path(os.environ["TUNEPLANE_OUTPUT_DIR"])
names = ("SIGHUP", "SIGUSR1", "SIGUSR2", "SIGTERM")  # not SIGINT: Python itself traps it
(out / "dispositions.json").write_text(json.dumps(
    {n: signal.getsignal(getattr(signal, n)) == signal.SIG_DFL for n in names}))
"""


def test_the_workload_starts_with_every_signal_at_its_default(built, tmp_path: Path) -> None:
    # The runner and keeper live through SIGHUP and the preemption signals, but with handlers: an ignored
    # one (SIG_IGN) would stay ignored in the workload, and a job whose preemption signal is SIGHUP, without
    # a trap of its own, would never stop for it.
    root = _prepared_member(built, tmp_path, entrypoint=f"exec {sys.executable} main.py")
    (root / "src" / "main.py").write_text(DISPOSITIONS)
    done = _run(root)
    assert done.returncode == 0, done.stdout + done.stderr
    seen = json.loads((root / "output" / "dispositions.json").read_text())
    assert seen == {"SIGHUP": True, "SIGUSR1": True, "SIGUSR2": True, "SIGTERM": True}


def test_a_member_start_runs_the_runner_without_the_cli_or_the_database_driver(built, tmp_path: Path) -> None:
    # As the agent and a Slurm step start it (runner_command), from its start to its exit status: every
    # module it imports is paid by each member start on a node whose other members start too (issue 23).
    from tuneplane.workers.runner import runner_command

    root = _prepared_member(built, tmp_path, exit_code=0)
    done = subprocess.run(runner_command(root), env={**os.environ, "PYTHONPROFILEIMPORTTIME": "1"},
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads((root / "exit_status.json").read_text())["exit_code"] == 0
    imported = {
        line.split("|")[-1].strip() for line in done.stderr.splitlines() if line.startswith("import time:")
    }
    assert "tuneplane.workers.runner.process" in imported  # the profile is the runner's own
    heavy = {"click", "psycopg", "pydantic", "tuneplane.app.cli", "importlib.metadata", "httpx", "aiohttp",
             "dataclasses", "email.parser", "shutil", "hashlib"}  # fmt: skip
    assert imported & heavy == set()


def test_the_runner_module_refuses_arguments_it_does_not_know_with_usage(tmp_path: Path) -> None:
    from tuneplane.workers.runner import runner_command

    for argv in (runner_command(tmp_path)[:-2], [*runner_command(tmp_path)[:-1], str(tmp_path / "missing")]):
        done = subprocess.run(argv, capture_output=True, text=True, timeout=60)
        assert done.returncode == 1, done.stderr
        assert "usage: python -m tuneplane.workers.runner" in done.stderr
        assert "Traceback" not in done.stderr


WAIT_THEN_EXIT = """import os, pathlib, sys, time
out = pathlib.Path(os.environ["TUNEPLANE_OUTPUT_DIR"])
(out / "started").write_text(str(os.getpid()))
while not (out / "release").exists():
    time.sleep(0.05)
(out / "checkpoint.txt").write_text("done")
sys.exit(int(os.environ.get("EXIT", "0")))
"""


def _start_runner(root: Path, **env: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-P", "-m", "tuneplane", "runner", "--member-dir", str(root)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, **env})  # fmt: skip


def test_a_killed_runner_is_not_a_failed_workload_its_keeper_writes_the_real_exit_status(
    built, tmp_path: Path
) -> None:
    root = _prepared_member(built, tmp_path, exit_code=7)
    (root / "src" / "main.py").write_text(WAIT_THEN_EXIT)
    runner = _start_runner(root)
    wait_for(lambda: (root / "output" / "started").exists(), timeout=30, what="the workload to start")
    assert member_lock_held(root)
    pids = read_runner_pids(root)
    assert pids["runner"] == runner.pid and pids["keeper"] != runner.pid
    runner.kill()  # kill -9 of the runner mid-run
    runner.wait(10)
    assert member_lock_held(root), "the keeper holds the member directory while the workload runs"
    assert not (root / "exit_status.json").exists()
    (root / "output" / "release").write_text("go")
    wait_for(lambda: (root / "exit_status.json").exists(), timeout=30, what="the keeper's exit status")
    status = json.loads((root / "exit_status.json").read_text())
    assert status["exit_code"] == 7 and status["reason"] == "exited with status 7"
    assert (root / "output" / "checkpoint.txt").read_text() == "done"
    wait_for(lambda: not member_lock_held(root), timeout=10, what="the keeper to let go of the lock")


def test_a_second_runner_for_a_live_member_refuses_without_touching_it(built, tmp_path: Path) -> None:
    root = _prepared_member(built, tmp_path)
    (root / "src" / "main.py").write_text(WAIT_THEN_EXIT)
    first = _start_runner(root)
    try:
        wait_for(lambda: (root / "output" / "started").exists(), timeout=30, what="the workload to start")
        second = _run(root)
        assert second.returncode == LOCKED_EXIT and "another runner holds" in second.stdout
        assert not (root / "exit_status.json").exists()
        (root / "output" / "release").write_text("go")
        assert first.wait(30) == 0
    finally:
        if first.poll() is None:
            first.kill()
    assert json.loads((root / "exit_status.json").read_text())["exit_code"] == 0
    assert (root / "logs" / "stdout.log").read_text().count("starting member") == 0
    assert "starting member" in first.stdout.read()  # type: ignore[union-attr]


TRAP_USR1 = """import os, pathlib, signal, sys, time
out = pathlib.Path(os.environ["TUNEPLANE_OUTPUT_DIR"])
got = []
signal.signal(signal.SIGUSR1, lambda *_: got.append(1))
(out / "started").write_text(str(os.getpid()))
while not got:
    time.sleep(0.02)
time.sleep(0.5)  # any other copy of the request arrives meanwhile, while the trap still counts it
(out / "saved").write_text(str(len(got)))
sys.exit(0)
"""


def test_a_preemption_signal_sent_to_the_runner_and_keeper_ends_neither_and_reaches_the_workload(
    built, tmp_path: Path
) -> None:
    # As on a Slurm step: `scancel --signal=USR1` reaches every process, the runner and its keeper too.
    # The interpreter itself (exec), not a `python` on PATH that may be a wrapper script the signal ends.
    root = _prepared_member(built, tmp_path, entrypoint=f"exec {sys.executable} main.py")
    (root / "src" / "main.py").write_text(TRAP_USR1)
    runner = _start_runner(root)
    wait_for(lambda: (root / "output" / "started").exists(), timeout=30, what="the workload to start")
    pids = read_runner_pids(root)
    os.kill(pids["keeper"], signal.SIGUSR1)
    os.kill(runner.pid, signal.SIGUSR1)
    assert runner.wait(30) == 0
    status = json.loads((root / "exit_status.json").read_text())
    assert status["exit_code"] == 0 and status["reason"] == "exited with status 0", status
    # One request, though it reached the keeper twice (directly, and forwarded by the runner): a second copy
    # may land while the workload's interpreter shuts down, its trap gone, and kill it.
    assert (root / "output" / "saved").read_text() == "1"


# Issue 35: a workload that saves for longer than the keeper's old 5 s leftover grace after the job's signal.
SLOW_SAVE = """import os, pathlib, signal, sys, time
out = pathlib.Path(os.environ["TUNEPLANE_OUTPUT_DIR"])
asked = []
signal.signal(signal.SIGTERM, signal.SIG_IGN if os.environ.get("IGNORE") else lambda *_: asked.append(1))
(out / "started").write_text(f"{os.getpid()} {os.getppid()}")
while not asked:
    time.sleep(0.02)
time.sleep(6.5)  # the checkpoint takes longer than 5 s
(out / "saved").write_text("yes")
sys.exit(0)
"""


def test_a_single_command_entrypoint_is_the_workload_process_itself_not_a_shells_child(
    built, tmp_path: Path
) -> None:
    # Debian's /bin/sh (dash) runs `sh -c "python main.py"` as a child: the job's signal would end the shell.
    root = _prepared_member(built, tmp_path, entrypoint="python main.py")
    (root / "src" / "main.py").write_text(WAIT_THEN_EXIT.replace("str(os.getpid())", "str(os.getppid())"))
    runner = _start_runner(root)
    wait_for(lambda: (root / "output" / "started").exists(), timeout=30, what="the workload to start")
    assert int((root / "output" / "started").read_text()) == read_runner_pids(root)["keeper"]
    (root / "output" / "release").write_text("go")
    assert runner.wait(30) == 0


def _shell_and_program(root: Path) -> tuple[int, int]:
    wait_for(lambda: (root / "output" / "started").exists(), timeout=30, what="the workload to start")
    program, shell = map(int, (root / "output" / "started").read_text().split())
    assert shell != read_runner_pids(root)["keeper"], "a compound command runs below /bin/sh"
    return shell, program


@pytest.mark.parametrize("how", ["stop", "preempt"])
def test_a_program_below_a_signalled_shell_saves_for_as_long_as_it_needs_and_its_status_is_recorded(
    built, tmp_path: Path, how: str
) -> None:
    root = _prepared_member(built, tmp_path, entrypoint="cd . && python main.py")
    (root / "src" / "main.py").write_text(SLOW_SAVE)
    runner = _start_runner(root)
    shell, program = _shell_and_program(root)
    if how == "stop":  # the agent's STOP: SIGTERM to the member's processes, the runner's keeper among them
        os.kill(read_runner_pids(root)["keeper"], signal.SIGTERM)
    else:  # the agent's PREEMPT: the request file, then the job's signal to the workload's processes only
        (root / "output" / ".tuneplane").mkdir()
        (root / "output" / ".tuneplane" / "preempt.json").write_text("{}")
        os.kill(shell, signal.SIGTERM)
        os.kill(program, signal.SIGTERM)
    assert runner.wait(30) == 0
    assert (root / "output" / "saved").read_text() == "yes"
    status = json.loads((root / "exit_status.json").read_text())
    assert status["exit_code"] == 0, status  # the program's, not the killed shell's


def test_a_program_that_ignores_the_stop_is_left_to_the_deadline_not_killed_before_it(
    built, tmp_path: Path
) -> None:
    root = _prepared_member(built, tmp_path, entrypoint="cd . && python main.py")
    (root / "src" / "main.py").write_text(SLOW_SAVE)
    runner = _start_runner(root, IGNORE="1")
    _, program = _shell_and_program(root)
    os.kill(read_runner_pids(root)["keeper"], signal.SIGTERM)
    with pytest.raises(subprocess.TimeoutExpired):
        runner.wait(6.0)  # past the old 5 s: the program still runs, the keeper still waits
    assert os.path.exists(f"/proc/{program}")
    os.kill(program, signal.SIGKILL)  # the agent's SIGKILL at the end of the grace
    assert runner.wait(30) == 0
    status = json.loads((root / "exit_status.json").read_text())
    assert status["exit_code"] == -signal.SIGKILL, status


def test_a_stop_inside_a_slurm_step_is_said_to_be_slurms_not_the_agents() -> None:
    from tuneplane.workers.runner.process import describe_exit

    assert describe_exit(-15, True, {}) == "killed by SIGTERM (stopped by the agent)"
    assert describe_exit(-15, True, {"SLURM_JOB_ID": "12"}) == "killed by SIGTERM (stopped by Slurm)"
    assert describe_exit(3, True, {"SLURM_JOB_ID": "12"}) == "exited with status 3 after Slurm's stop"
