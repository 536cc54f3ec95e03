"""The agent's private state directory and the workload directory, kept apart.

The state directory holds the node credential (mode 0600 in a 0700 directory). Workloads get
directories only under the work directory (`--work-dir`, default: a sibling `<state-dir>-work`), and the
two may not contain each other, so no directory handed to a workload can contain the credential.
"""

from __future__ import annotations

import json
import os
import stat
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Protocol

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


@dataclass(frozen=True)
class StoredCredential:
    node_id: int
    node: str
    fleet: str
    credential: str
    credential_id: int | None = None


class CredentialStore(Protocol):
    def load(self) -> StoredCredential | None: ...

    def save(self, credential: StoredCredential) -> None: ...


class FileCredentialStore:
    """The credential as JSON in one file, written atomically with mode 0600."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def load(self) -> StoredCredential | None:
        try:
            info = os.stat(self.path)
        except FileNotFoundError:
            return None
        if stat.S_IMODE(info.st_mode) & 0o077:
            raise StateError(
                f"{self.path} is accessible to other users (mode {stat.S_IMODE(info.st_mode):o}); "
                f"run `chmod 600 {self.path}`"
            )
        try:
            return StoredCredential(**json.loads(self.path.read_text()))
        except (ValueError, TypeError) as exc:
            raise StateError(f"{self.path} is not a node credential file: {exc}") from exc

    def save(self, credential: StoredCredential) -> None:
        tmp = self.path.with_name(self.path.name + ".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.fchmod(fd, 0o600)  # the umask cannot widen it, an older tmp file cannot keep its mode
            os.write(fd, json.dumps(asdict(credential)).encode())
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, self.path)
        dir_fd = os.open(self.path.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)


class MemoryCredentialStore:
    """For benchmarks that run thousands of agents in one process."""

    def __init__(self, credential: StoredCredential | None = None) -> None:
        self.credential = credential

    def load(self) -> StoredCredential | None:
        return self.credential

    def save(self, credential: StoredCredential) -> None:
        self.credential = credential
