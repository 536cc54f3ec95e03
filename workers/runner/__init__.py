"""The runner (one process per member, started by the agent in its own session, or by a Slurm step):
`runtime` checks the pinned runtime, `environment` builds the workload's environment and command,
`process` runs it, keeps logs and writes the exit status file."""

from __future__ import annotations

import sys
from pathlib import Path


def runner_command(member_dir: Path | str) -> list[str]:
    """How the agent and a Slurm step start a member's runner: the module itself (`__main__.py`), not the
    `tuneplane runner` command, whose CLI (click, the command table) is 30-40 ms of CPU per member start
    that a busy node pays while its other members start."""
    return [sys.executable, "-P", "-m", "tuneplane.workers.runner", "--member-dir", str(member_dir)]


def standby_command() -> list[str]:
    """How the agent starts a standby runner (standby.py): one that learns its member at START."""
    return [sys.executable, "-P", "-m", "tuneplane.workers.runner", "--standby"]
