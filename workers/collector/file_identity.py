"""Which file is this? (device, inode) plus a hash of its first 64 bytes, so a recycled inode is noticed.

A file shorter than 64 bytes is identified by the bytes it has so far (`prefix_len` says how many); once it
has grown, the identity is widened to 64 bytes after checking that the shorter prefix still matches.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import asdict, dataclass

PREFIX_BYTES = 64


@dataclass(frozen=True)
class FileIdentity:
    dev: int
    ino: int
    prefix_len: int
    prefix_sha256: str

    @property
    def key(self) -> tuple[int, int]:
        return (self.dev, self.ino)

    def as_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> FileIdentity:
        return cls(int(data["dev"]), int(data["ino"]), int(data["prefix_len"]), str(data["prefix_sha256"]))


def _prefix_hash(fd: int, length: int) -> tuple[int, str]:
    data = os.pread(fd, length, 0)
    return len(data), hashlib.sha256(data).hexdigest()


def identify(fd: int) -> FileIdentity:
    st = os.fstat(fd)
    length, digest = _prefix_hash(fd, PREFIX_BYTES)
    return FileIdentity(st.st_dev, st.st_ino, length, digest)


def still_same(known: FileIdentity, fd: int) -> FileIdentity | None:
    """`known` (possibly widened to 64 bytes) if `fd` is the same file, None if the inode was recycled."""
    st = os.fstat(fd)
    if (st.st_dev, st.st_ino) != known.key:
        return None
    _, digest = _prefix_hash(fd, known.prefix_len)
    if digest != known.prefix_sha256:
        return None
    if known.prefix_len < PREFIX_BYTES and st.st_size > known.prefix_len:
        return identify(fd)
    return known
