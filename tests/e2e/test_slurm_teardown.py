"""The Slurm test cluster (tests/slurm_cluster.py) ends every process of its own when it stops, the step
daemons a killed slurmd leaves behind included (they outlived test sessions by hours before)."""

from __future__ import annotations

import contextlib
from pathlib import Path

import pytest

from tests.helpers import wait_for
from tests.slurm_cluster import require_binaries, started_cluster

pytestmark = pytest.mark.e2e


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _alive(pid: int) -> bool:
    """Running (a zombie waiting for its parent to read its status runs nothing any more)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_teardown_leaves_no_process_behind_even_step_daemons_of_a_killed_slurmd() -> None:
    require_binaries()
    teardown = started_cluster(1)
    cluster = next(teardown)
    try:
        cluster.run("sbatch", "-p", "batch", "-N", "1", "-o", "/dev/null", "--wrap", "srun sleep 300")
        wait_for(
            lambda: any(Path(_cmdline(p) or "-").name.startswith("sleep ") for p in cluster.processes_of()),
            timeout=60,
            what="the job's step running",
        )
        cluster.kill_node("tpn1")  # its step daemons are orphaned, as on a machine that lost its slurmd
        seen = cluster.processes_of()
        assert any(_cmdline(p).startswith("slurmstepd") for p in seen), [_cmdline(p) for p in seen]
    finally:
        with contextlib.suppress(StopIteration):
            next(teardown)  # the cluster's stop() and the removal of its directory
    assert cluster.processes_of() == []
    assert [p for p in seen if _alive(p)] == []
