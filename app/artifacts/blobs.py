"""A content-addressed blob store on the filesystem: a blob lives at <root>/sha256/<ab>/<sha256>.

A blob enters only through `put_verified`, which re-hashes the candidate file and renames it into place
atomically, so a path under sha256/ never holds a partial or wrong file unless someone edits it on disk
afterwards (which every read that matters — downloads, verification — detects by hashing again).
"""

from __future__ import annotations

import hashlib
import os
import re
import tempfile
from pathlib import Path
from typing import BinaryIO

_SHA256 = re.compile(r"^[0-9a-f]{64}$")
_BLOCK = 1024 * 1024


class BlobError(RuntimeError):
    pass


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class FsBlobStore:
    def __init__(self, root: Path | str) -> None:
        self.root = Path(root)

    def path(self, sha256: str) -> Path:
        if not _SHA256.match(sha256):
            raise BlobError(f"not a sha256 digest: {sha256!r}")
        return self.root / "sha256" / sha256[:2] / sha256

    def has(self, sha256: str) -> bool:
        return self.path(sha256).is_file()

    def open(self, sha256: str) -> BinaryIO | None:
        try:
            return open(self.path(sha256), "rb")
        except FileNotFoundError:
            return None

    def temp_file(self) -> tuple[BinaryIO, Path]:
        """A writable temporary file on the same filesystem as the blobs (for an atomic rename)."""
        tmp_dir = self.root / "tmp"
        tmp_dir.mkdir(parents=True, exist_ok=True)
        fd, name = tempfile.mkstemp(dir=tmp_dir, prefix="blob-")
        return os.fdopen(fd, "wb"), Path(name)

    def put_verified(self, candidate: Path, sha256: str, size: int) -> bool:
        """Move `candidate` into the store as blob `sha256` if its bytes hash to it; False if they do not
        (the candidate is then deleted). A blob already there is replaced by these identical bytes."""
        digest = hashlib.sha256()
        actual = 0
        with open(candidate, "rb") as handle:
            while block := handle.read(_BLOCK):
                digest.update(block)
                actual += len(block)
            os.fsync(handle.fileno())
        if digest.hexdigest() != sha256 or actual != size:
            candidate.unlink(missing_ok=True)
            return False
        target = self.path(sha256)
        target.parent.mkdir(parents=True, exist_ok=True)
        os.replace(candidate, target)
        fsync_dir(target.parent)
        return True

    def put_bytes(self, data: bytes, sha256: str) -> bool:
        """`put_verified` for bytes held in memory (an inline file, the empty file)."""
        handle, tmp = self.temp_file()
        with handle:
            handle.write(data)
        return self.put_verified(tmp, sha256, len(data))

    def adopt_hashed(self, candidate: Path, sha256: str) -> None:
        """Move `candidate`, whose bytes the caller has just hashed to `sha256` (and fsynced), into place."""
        target = self.path(sha256)
        target.parent.mkdir(parents=True, exist_ok=True)
        os.replace(candidate, target)
        fsync_dir(target.parent)
