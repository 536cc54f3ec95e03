"""The torchrun integration really runs PyTorch distributed across two members on loopback (gloo, CPU)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import free_port

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
TRAIN = """
import os, torch, torch.distributed as dist
dist.init_process_group("gloo")
value = torch.tensor([float(dist.get_rank() + 1)])
dist.all_reduce(value)
with open(f"result-{os.environ['TUNEPLANE_MEMBER_RANK']}.txt", "w") as f:
    f.write(f"{dist.get_rank()} {dist.get_world_size()} {value.item()}")
dist.destroy_process_group()
"""


def test_two_members_form_one_process_group(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    (tmp_path / "train.py").write_text(TRAIN)
    port = free_port()
    members = []
    for rank in range(2):
        env = {
            **os.environ,
            "PYTHONPATH": str(REPO),
            "RANK": str(rank),
            "WORLD_SIZE": "2",
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
            "TUNEPLANE_GPUS_PER_NODE": "0",
            "TUNEPLANE_ENTRYPOINT": "python train.py",
            "OMP_NUM_THREADS": "1",
        }
        members.append(
            subprocess.Popen(
                [sys.executable, "-m", "tuneplane.workers.integrations.torchrun"],
                cwd=tmp_path,
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
        )
    outputs = [m.communicate(timeout=180)[0] for m in members]
    assert [m.returncode for m in members] == [0, 0], outputs
    results = sorted((tmp_path / f"result-{rank}.txt").read_text() for rank in range(2))
    assert results == ["0 2 3.0", "1 2 3.0"]
