"""The node credential the agent keeps between runs: a file in the state directory (mode 0600, written
atomically), or memory for benchmarks that run thousands of agents in one process."""

from __future__ import annotations

import json
import os
import stat
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Protocol

from tuneplane.workers.agent.directories import StateError


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
