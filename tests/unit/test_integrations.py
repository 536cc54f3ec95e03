"""The built-in integrations: registered as plugins, pinned by file digest, and really runnable."""

from __future__ import annotations

import importlib.util
import json
import os
import struct
import subprocess
import sys
from pathlib import Path

import google_crc32c
import pytest

from tuneplane.app.submission.pins import artifact_pin, integrations, python_runtime_pin, recipe_params
from tuneplane.workers.integrations.torchrun import TorchrunConfigError, build_argv, target_args

REPO = Path(__file__).resolve().parents[2]


def _masked_crc(data: bytes) -> int:
    crc = google_crc32c.value(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def read_scalars(path: Path) -> dict[str, list[tuple[int, float]]]:
    """Scalars from a TensorBoard event file, checking every record's CRCs."""
    from tensorboardX.proto import event_pb2

    data = path.read_bytes()
    offset, scalars = 0, {}
    while offset < len(data):
        header = data[offset : offset + 8]
        (length,) = struct.unpack("<Q", header)
        (header_crc,) = struct.unpack("<I", data[offset + 8 : offset + 12])
        assert header_crc == _masked_crc(header)
        body = data[offset + 12 : offset + 12 + length]
        (body_crc,) = struct.unpack("<I", data[offset + 12 + length : offset + 16 + length])
        assert body_crc == _masked_crc(body)
        event = event_pb2.Event.FromString(body)
        for value in event.summary.value:
            scalars.setdefault(value.tag, []).append((event.step, value.simple_value))
        offset += 16 + length
    return scalars


def test_builtin_integrations_are_plugins_with_pinnable_files() -> None:
    found = integrations()
    assert {"demo", "script", "torchrun"} <= set(found)
    assert found["demo"].kind == "recipe" and found["script"].kind == "launcher"
    for name in ("demo", "script", "torchrun"):
        pin = artifact_pin(found[name])
        assert pin["sha256"] == artifact_pin(found[name])["sha256"] and len(pin["files"]) == 1
        module = found[name].plugin.details["module"]
        assert importlib.util.find_spec(module) is not None
    runtime, warnings = python_runtime_pin(found["demo"])
    assert runtime["python"] == f"{sys.version_info.major}.{sys.version_info.minor}"
    assert set(runtime["packages"]) == {"numpy", "tensorboardX"} and not warnings


def test_recipe_params_get_defaults_and_types() -> None:
    demo = integrations()["demo"]
    params = recipe_params(demo, {"steps": "50", "lr": "0.2"})
    assert params["steps"] == 50 and params["lr"] == 0.2 and params["batch_size"] == 64


def test_demo_trains_and_writes_jsonl_and_tensorboard(tmp_path: Path) -> None:
    env = {**os.environ, "TUNEPLANE_OUTPUT_DIR": str(tmp_path / "out"), "TUNEPLANE_PARAMS": '{"seed": 3}'}
    result = subprocess.run(
        [sys.executable, "-m", "tuneplane.workers.integrations.demo", "--steps", "50", "--step-seconds", "0"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    lines = [json.loads(line) for line in (tmp_path / "out" / "metrics.jsonl").read_text().splitlines()]
    assert [line["step"] for line in lines] == list(range(1, 51))
    assert all(set(line) == {"step", "loss", "lr"} for line in lines)
    assert lines[-1]["loss"] < lines[0]["loss"] / 2, "the model must really learn"
    events = list((tmp_path / "out" / "tensorboard").glob("events.out.tfevents.*"))
    assert len(events) == 1
    scalars = read_scalars(events[0])
    assert [step for step, _ in scalars["loss"]] == list(range(1, 51))
    assert scalars["loss"][-1][1] == pytest.approx(lines[-1]["loss"], rel=1e-5)
    assert len(scalars["lr"]) == 50
    assert (tmp_path / "out" / "checkpoint" / "model.npz").is_file()


@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="PyTorch is not installed here")
def test_demo_writes_its_tensorboard_scalars_without_importing_torch(tmp_path: Path) -> None:
    """tensorboardX imports torch whenever it is installed: 1.3 of the NumPy demo's 1.7 CPU-seconds of
    start-up on a node with PyTorch. The demo hides torch from that import, and only from it."""
    script = (
        "import sys\n"
        "from tuneplane.workers.integrations import demo\n"
        f"demo.main(['--steps', '3', '--step-seconds', '0', '--output-dir', {str(tmp_path / 'out')!r}])\n"
        "print('torch imported' if 'torch' in sys.modules else 'torch not imported')\n"
        "import torch\n"
        "print('torch importable', torch.__name__)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=120, check=False
    )
    assert result.returncode == 0, result.stderr
    assert "torch not imported" in result.stdout and "torch importable torch" in result.stdout
    events = list((tmp_path / "out" / "tensorboard").glob("events.out.tfevents.*"))
    assert [step for step, _ in read_scalars(events[0])["loss"]] == [1, 2, 3]


def test_demo_refuses_bad_arguments(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "tuneplane.workers.integrations.demo", "--steps", "0"],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2 and "steps" in result.stderr


def test_script_runs_the_entrypoint_through_the_shell_with_its_exit_status(tmp_path: Path) -> None:
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "RANK": "1",
        "TUNEPLANE_ENTRYPOINT": "echo rank=$RANK in $(pwd); exit 3",
    }
    result = subprocess.run(
        [sys.executable, "-m", "tuneplane.workers.integrations.script"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 3 and result.stdout.strip() == f"rank=1 in {tmp_path}"


def test_script_execs_a_single_simple_command_and_leaves_anything_else_to_the_shell() -> None:
    """Issue 35: `python train.py` replaces the integration's process (dash would run it as a child that
    the job's signal outlives the shell of); shell syntax still goes through /bin/sh."""
    from tuneplane.workers.integrations.script import direct_argv

    assert direct_argv("python train.py --lr 3e-4") == ["python", "train.py", "--lr", "3e-4"]
    assert direct_argv("python 'my script.py' --name=\"a b\"") == ["python", "my script.py", "--name=a b"]
    for shell in (
        "cd src && make",
        "echo $HOME",
        "python t.py > log",
        "A=1 python t.py",
        "exec python t.py",
        "python *.py",
        "python t.py; echo done",
        "cd src",
        "python 'open",
        "~/bin/train",
    ):
        assert direct_argv(shell) is None, shell


def test_script_says_a_missing_program_as_the_shell_does(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO), "TUNEPLANE_ENTRYPOINT": "no-such-program-35 --x"}
    result = subprocess.run(
        [sys.executable, "-m", "tuneplane.workers.integrations.script"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode == 127 and "no-such-program-35" in result.stderr, result.stderr
    assert "Traceback" not in result.stderr


def test_torchrun_builds_a_static_rendezvous_from_the_runner_environment() -> None:
    env = {
        "RANK": "1",
        "WORLD_SIZE": "2",
        "MASTER_ADDR": "10.0.0.1",
        "MASTER_PORT": "29500",
        "TUNEPLANE_GPUS_PER_NODE": "4",
    }
    argv = build_argv("python train.py --epochs 3", env, python="py")
    assert argv == [
        "py",
        "-m",
        "torch.distributed.run",
        "--nnodes=2",
        "--node-rank=1",
        "--nproc-per-node=4",
        "--master-addr=10.0.0.1",
        "--master-port=29500",
        "train.py",
        "--epochs",
        "3",
    ]
    assert target_args("python -m pkg.train --x") == ["-m", "pkg.train", "--x"]
    assert target_args("train.py") == ["train.py"]
    assert target_args("make train") == ["--no-python", "make", "train"]
    assert "--nproc-per-node=1" in build_argv("t.py", {**env, "TUNEPLANE_GPUS_PER_NODE": "0"})
    with pytest.raises(TorchrunConfigError):
        build_argv("t.py", {"RANK": "0"})
    with pytest.raises(TorchrunConfigError):
        build_argv("t.py", {**env, "RANK": "2"})
