"""The agent's two directories, kept apart: the private state directory and the work directory.

The state directory holds the node credential (mode 0600 in a 0700 directory). Workloads get
directories only under the work directory (`--work-dir`, default: a sibling `<state-dir>-work`), and the
two may not contain each other, so no directory handed to a workload can contain the credential.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

# The node credential's file in the state directory (workers.agent.credential reads and writes it).
CREDENTIAL_FILE = "node-credential.json"


class StateError(Exception):
    """The state or work directory is unusable; the message says why."""


@dataclass(frozen=True)
class AgentPaths:
    state_dir: Path
    work_dir: Path

    @classmethod
    def prepare(cls, state_dir: str | Path, work_dir: str | Path | None = None) -> AgentPaths:
        state = Path(state_dir).expanduser().resolve()
        work = (Path(work_dir).expanduser() if work_dir else state.parent / f"{state.name}-work").resolve()
        if state == work or state.is_relative_to(work):
            raise StateError(
                f"state directory {state} is inside the work directory {work}: the node credential must "
                "never be under a directory given to workloads; choose a separate --state-dir"
            )
        if work.is_relative_to(state):
            raise StateError(
                f"work directory {work} is inside the state directory {state}; choose a separate --work-dir"
            )
        for path in (state, work):
            if path.exists() and not path.is_dir():
                raise StateError(f"{path} exists and is not a directory")
        state.mkdir(parents=True, exist_ok=True, mode=0o700)
        os.chmod(state, 0o700)
        work.mkdir(parents=True, exist_ok=True)
        return cls(state, work)

    @property
    def credential_path(self) -> Path:
        return self.state_dir / CREDENTIAL_FILE

    def workload_dir(self, *parts: str) -> Path:
        """A directory for a workload, always under the work directory (never the state directory)."""
        path = self.work_dir.joinpath(*parts).resolve()
        if not path.is_relative_to(self.work_dir) or path == self.work_dir:
            raise StateError(f"workload directory {path} would escape the work directory {self.work_dir}")
        path.mkdir(parents=True, exist_ok=True)
        return path
