"""The preemption signal reaches a cooperating workload as a request, not as its death.

The agent writes .tuneplane/preempt.json and sends the job's signal (SIGTERM by default) to the
workload's processes. Python's default action for SIGTERM ends the process at once, so a workload that
polls sdk.preempting() would die before saving the checkpoint it was asked for (the e2e preemption tests
failed so, about one run in two). These run a real Python process and send it a real signal."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tuneplane.workers.runner.environment import MemberPaths, member_variables

# Polls preempting() as the demo recipe does; prints when it is ready and when it heard the request.
WORKLOAD = """
import sys, time
from tuneplane import sdk
sdk.preempting()
print("ready", flush=True)
deadline = time.monotonic() + 20
while not sdk.preempting():
    if time.monotonic() > deadline:
        sys.exit(3)
    time.sleep(0.01)
print("asked to stop: saving a checkpoint", flush=True)
"""


def _start(tmp_path: Path, source: str, signal_name: str | None) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TUNEPLANE_")}
    env["TUNEPLANE_OUTPUT_DIR"] = str(tmp_path)
    if signal_name:
        env["TUNEPLANE_PREEMPTION_SIGNAL"] = signal_name
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[2])
    proc = subprocess.Popen([sys.executable, "-c", source], env=env, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    return proc


@pytest.mark.parametrize("name", ["SIGTERM", "SIGINT", "SIGUSR1"])
def test_a_workload_that_polls_preempting_hears_the_signal_and_lives_to_checkpoint(
    tmp_path: Path, name: str
) -> None:
    proc = _start(tmp_path, WORKLOAD, name)
    proc.send_signal(getattr(signal, name))
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0 and "asked to stop: saving a checkpoint" in out


def test_outside_tuneplane_the_signal_keeps_its_default_action(tmp_path: Path) -> None:
    proc = _start(tmp_path, WORKLOAD, None)
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=30)
    assert proc.returncode == -signal.SIGTERM


def test_a_handler_the_workload_installed_itself_is_kept(tmp_path: Path) -> None:
    source = "import signal, sys\nsignal.signal(signal.SIGTERM, lambda *a: sys.exit(7))\n" + WORKLOAD
    proc = _start(tmp_path, source, "SIGTERM")
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=30)
    assert proc.returncode == 7


def test_the_runner_names_the_jobs_stop_signal_for_every_job(tmp_path: Path) -> None:
    """Time limits and idle reclaims ask jobs that are not preemptible too."""
    member = {"rank": 0, "world_size": 1, "master_addr": "127.0.0.1", "master_port": 1, "job_id": 1,
              "attempt": 1}  # fmt: skip
    paths = MemberPaths(tmp_path)
    chosen = {"preemptible": True, "preemption": {"signal": "SIGUSR1"}}
    assert member_variables(member, chosen, paths)["TUNEPLANE_PREEMPTION_SIGNAL"] == "SIGUSR1"
    assert member_variables(member, {"preemptible": False}, paths)["TUNEPLANE_PREEMPTION_SIGNAL"] == "SIGTERM"
