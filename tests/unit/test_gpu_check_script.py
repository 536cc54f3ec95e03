"""bench/gpu_check.sh on a machine without an NVIDIA GPU: it says so and succeeds, doing nothing else (the
GPU path itself needs a GPU machine: docs/operations.md)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "gpu_check.sh"


def run(path: str, tmp_path: Path) -> subprocess.CompletedProcess:
    env = {"PATH": path, "HOME": str(tmp_path), "TMPDIR": str(tmp_path / "tmp")}
    (tmp_path / "tmp").mkdir(exist_ok=True)
    return subprocess.run(["bash", str(SCRIPT)], env=env, capture_output=True, text=True, timeout=60)


def fake_nvidia_smi(directory: Path, script: str) -> str:
    directory.mkdir()
    binary = directory / "nvidia-smi"
    binary.write_text(f"#!/bin/sh\n{script}\n")
    binary.chmod(0o755)
    return f"{directory}:/usr/bin:/bin"


@pytest.mark.parametrize(
    "nvidia_smi",
    [
        None,  # no driver installed at all
        "echo 'NVIDIA-SMI has failed because it couldn'\\''t communicate with the NVIDIA driver.'; exit 9",
        "echo 'No devices were found'; exit 6",
    ],
    ids=["no-nvidia-smi", "driver-not-loaded", "no-devices"],
)
def test_without_an_nvidia_gpu_the_check_is_skipped_with_exit_0(
    tmp_path: Path, nvidia_smi: str | None
) -> None:
    path = "/usr/bin:/bin" if nvidia_smi is None else fake_nvidia_smi(tmp_path / "bin", nvidia_smi)
    done = run(path, tmp_path)
    assert (done.returncode, done.stdout) == (0, "no NVIDIA GPU: skipped\n"), done.stderr
    assert os.listdir(tmp_path / "tmp") == []  # nothing was installed or started


def test_the_script_is_executable_and_takes_no_arguments() -> None:
    assert os.access(SCRIPT, os.X_OK)
    assert subprocess.run(["bash", "-n", str(SCRIPT)], capture_output=True).returncode == 0


def test_offline_install_from_an_empty_wheelhouse_fails_at_the_venv_step_naming_pip(tmp_path: Path) -> None:
    """WHEELHOUSE=DIR installs with --no-index from DIR alone: with nothing there the venv step fails,
    saying what pip could not install, and the summary names the step (a borrowed machine that reaches no
    registry then says why in one run instead of hanging on a download)."""
    path = fake_nvidia_smi(tmp_path / "bin", "echo 'GPU 0: NVIDIA H200 (UUID: GPU-0)'")
    (tmp_path / "wheels").mkdir()
    env = {
        "PATH": f"{path}:{os.path.dirname(sys.executable)}",
        "HOME": str(tmp_path),
        "TMPDIR": str(tmp_path / "tmp"),
        "PYTHON": sys.executable,
        "TORCH_SPEC": "preinstalled",
        "WHEELHOUSE": str(tmp_path / "wheels"),
        "LOGS": str(tmp_path / "logs"),
    }
    (tmp_path / "tmp").mkdir()
    done = subprocess.run(["bash", str(SCRIPT)], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 1, done.stderr
    assert "FAILED at step 'venv': pip install of" in done.stderr
    assert "ERROR: Could not find a version that satisfies the requirement" in done.stderr
    assert "venv         FAILED" in done.stdout
    assert (tmp_path / "logs" / "gpu_check_logs.tar.gz").is_file()  # pip.log, for the reason in full
    assert os.listdir(tmp_path / "tmp") == []  # the work directory is removed (KEEP unset)
