"""Content-addressed blobs (source archives, capsules): an interface and a filesystem store.

A blob is named by the sha256 of its bytes. `stage()` gives a private temporary file on the store's own
filesystem; `commit_staged()` moves it into place atomically under its digest, so a reader never sees
a half-written blob and a crash leaves only a temporary file. The second implementation is the S3 store
(app/s3store.py): an S3 fleet's source archives (`POST /sources?fleet=`) and capsules live there.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO, Protocol

_SHA256 = re.compile(r"^[0-9a-f]{64}$")


class BlobStore(Protocol):
    def exists(self, sha256: str) -> bool: ...

    def open(self, sha256: str) -> BinaryIO: ...

    def stage(self) -> contextlib.AbstractContextManager[tuple[Path, BinaryIO]]: ...

    def commit_staged(self, staged: Path, sha256: str) -> bool: ...


def _check(sha256: str) -> str:
    if not _SHA256.match(sha256):
        raise ValueError(f"not a sha256 hex digest: {sha256!r}")
    return sha256


class FilesystemBlobStore:
    """Blobs at ROOT/sha256/ab/abcdef…; temporary uploads at ROOT/tmp (same filesystem, for rename)."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self.tmp = self.root / "tmp"

    def path(self, sha256: str) -> Path:
        digest = _check(sha256)
        return self.root / "sha256" / digest[:2] / digest

    def exists(self, sha256: str) -> bool:
        return self.path(sha256).is_file()

    def open(self, sha256: str) -> BinaryIO:
        return open(self.path(sha256), "rb")

    def stage(self) -> contextlib.AbstractContextManager[tuple[Path, BinaryIO]]:
        """A temporary file to write (in ROOT/tmp, for the rename); removed on exit unless committed."""
        self.tmp.mkdir(parents=True, exist_ok=True)
        return staged_file(self.tmp, "upload-")

    def commit_staged(self, staged: Path, sha256: str) -> bool:
        """Move a staged file into place under its digest (verified); False if it was already there."""
        target = self.path(sha256)
        if target.is_file():
            # Reused: refresh its time so blob garbage collection (which keeps recent blobs) cannot remove
            # it before the caller records the row that needs it.
            os.utime(target)
            return False
        actual = file_sha256(staged)
        if actual != sha256:
            raise ValueError(f"staged blob has sha256 {actual}, not {sha256}")
        target.parent.mkdir(parents=True, exist_ok=True)
        with open(staged, "rb") as handle:
            os.fsync(handle.fileno())
        os.chmod(staged, 0o444)
        os.replace(staged, target)
        return True


@contextlib.contextmanager
def staged_file(directory: Path | None, prefix: str) -> Iterator[tuple[Path, BinaryIO]]:
    """`stage()` of every store: a private temporary file (in `directory`, or the system's temporary
    directory) open for writing and reading, removed on exit unless its store moved it away."""
    fd, name = tempfile.mkstemp(dir=directory, prefix=prefix)
    path = Path(name)
    try:
        with os.fdopen(fd, "w+b") as handle:
            yield path, handle
    finally:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()


def file_sha256(path: Path, chunk: int = 1024 * 1024) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(chunk):
            digest.update(block)
    return digest.hexdigest()
