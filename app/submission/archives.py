"""Source archives on the server: receive, validate, store content-addressed, record.

Validation reads the whole gzip-compressed tar as a stream before anything is stored, and refuses with
its reason: a compressed size over the limit, something that is not a tar.gz, absolute member paths,
`..` components, links that point outside the archive, device files and FIFOs, more members than the
limit, and a decompressed size over the limit (counted as the stream is inflated, so a zip bomb is
stopped after at most the limit, not after it filled the disk). A refused upload leaves no blob and no
row. Limits are installation settings (table submission_settings, names archive_*).
"""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import posixpath
import tarfile
import zlib
from dataclasses import dataclass
from typing import BinaryIO

from app.blobstore import BlobStore
from app.db import Database
from app.errors import Refusal

CHUNK = 1024 * 1024
FIELD = "archive"


@dataclass(frozen=True)
class ArchiveLimits:
    max_bytes: int
    max_members: int
    max_unpacked_bytes: int

    @classmethod
    def from_db(cls, db: Database) -> ArchiveLimits:
        rows = db.fetch_all("SELECT name, value FROM submission_settings WHERE name LIKE 'archive\\_%'")
        values = {row["name"]: row["value"] for row in rows}
        return cls(
            values["archive_max_bytes"], values["archive_max_members"], values["archive_max_unpacked_bytes"]
        )


@dataclass(frozen=True)
class ArchiveFacts:
    sha256: str
    size_bytes: int
    member_count: int
    unpacked_bytes: int

    def as_json(self) -> dict:
        return {
            "sha256": self.sha256,
            "archive": f"sha256:{self.sha256}",
            "size_bytes": self.size_bytes,
            "member_count": self.member_count,
            "unpacked_bytes": self.unpacked_bytes,
        }


class ArchiveRefused(Refusal):
    pass


def _refuse(message: str, status: int = 422) -> ArchiveRefused:
    return ArchiveRefused(f"source archive refused: {message}", status=status, field=FIELD)


class _InflateCounter:
    """A read-only file object over the inflated stream that refuses past `limit` bytes."""

    def __init__(self, raw: BinaryIO, limits: ArchiveLimits) -> None:
        self._raw = raw
        self._limits = limits
        # Headers and padding inflate too: allow the declared-size limit plus tar's own overhead.
        self._limit = limits.max_unpacked_bytes + 512 * (limits.max_members * 3 + 2)
        self.count = 0

    def read(self, size: int = -1) -> bytes:
        data = self._raw.read(size)
        self.count += len(data)
        if self.count > self._limit:
            raise _too_big(self._limits)
        return data


def _too_big(limits: ArchiveLimits) -> ArchiveRefused:
    return _refuse(f"it expands to more than {limits.max_unpacked_bytes} bytes (the decompressed size limit)")


def _check_name(name: str) -> str:
    if not name or "\x00" in name:
        raise _refuse("a member has an empty or invalid name")
    if name.startswith("/") or (len(name) > 1 and name[1] == ":"):
        raise _refuse(f"member {name!r} has an absolute path")
    if ".." in name.split("/"):
        raise _refuse(f"member {name!r} has a '..' component")
    return posixpath.normpath(name)


def _escapes(path: str) -> bool:
    return path == ".." or path.startswith("../") or path.startswith("/")


def _check_member(member: tarfile.TarInfo) -> None:
    name = _check_name(member.name)
    if member.issym():
        target = member.linkname
        if not target or target.startswith("/"):
            raise _refuse(f"symlink {member.name!r} points to an absolute path {target!r}")
        resolved = posixpath.normpath(posixpath.join(posixpath.dirname(name), target))
        if _escapes(resolved):
            raise _refuse(f"symlink {member.name!r} points outside the archive ({target!r})")
    elif member.islnk():
        target = member.linkname
        if not target or target.startswith("/") or _escapes(posixpath.normpath(target)):
            raise _refuse(f"hard link {member.name!r} points outside the archive ({target!r})")
    elif member.ischr() or member.isblk():
        raise _refuse(f"member {member.name!r} is a device file")
    elif member.isfifo():
        raise _refuse(f"member {member.name!r} is a FIFO")
    elif member.issparse():
        raise _refuse(f"member {member.name!r} is a sparse file")
    elif not (member.isreg() or member.isdir()):
        raise _refuse(f"member {member.name!r} has an unsupported type")


def validate_archive(path: str, limits: ArchiveLimits) -> tuple[int, int]:
    """(member count, declared unpacked bytes) of a safe tar.gz, or an ArchiveRefused saying why not."""
    members = 0
    unpacked = 0
    try:
        with gzip.open(path, "rb") as inflated:
            counter = _InflateCounter(inflated, limits)
            with tarfile.open(fileobj=counter, mode="r|") as archive:  # type: ignore[call-overload]
                for member in archive:
                    members += 1
                    if members > limits.max_members:
                        raise _refuse(f"it has more than {limits.max_members} members (the limit)")
                    _check_member(member)
                    unpacked += max(member.size, 0)
                    if unpacked > limits.max_unpacked_bytes:
                        raise _too_big(limits)
    except ArchiveRefused:
        raise
    except (tarfile.TarError, gzip.BadGzipFile, zlib.error, EOFError, OSError) as exc:
        raise _refuse(f"not a gzip-compressed tar archive ({exc})") from exc
    if members == 0:
        raise _refuse("it has no members")
    return members, unpacked


def receive_archive(db: Database, store: BlobStore, user_id: int, stream: BinaryIO) -> ArchiveFacts:
    """Stream an upload into staging, validate it, store it under its sha256 and record it."""
    limits = ArchiveLimits.from_db(db)
    with store.stage() as (staged, handle):
        digest = hashlib.sha256()
        size = 0
        while chunk := stream.read(CHUNK):
            size += len(chunk)
            if size > limits.max_bytes:
                raise _refuse(f"it is larger than {limits.max_bytes} bytes (the upload limit)", status=413)
            digest.update(chunk)
            handle.write(chunk)
        handle.flush()
        if size == 0:
            raise _refuse("the upload is empty")
        members, unpacked = validate_archive(str(staged), limits)
        sha256 = digest.hexdigest()
        created = store.commit_staged(staged, sha256)
    try:
        db.call("record_source_archive", user_id, sha256, size, members, unpacked)
    except Exception:
        if created:
            _discard(store, sha256)
        raise
    return ArchiveFacts(sha256, size, members, unpacked)


def _discard(store: BlobStore, sha256: str) -> None:
    path_of = getattr(store, "path", None)
    if path_of is not None:
        with contextlib.suppress(FileNotFoundError):
            path_of(sha256).unlink()
