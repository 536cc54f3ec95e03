"""Source archives on the server: receive, validate, store content-addressed, record.

Validation reads the whole gzip-compressed tar as a stream before anything is stored, and refuses with
its reason: a body whose Content-Type is not an archive type, a compressed size over the limit,
something that is not a tar.gz, absolute member paths, `..` components, links that point outside the
archive (symlink chains resolved as an extractor would, after the last member), device files and FIFOs,
more members than the limit, a decompressed size over the limit (counted as the stream is inflated —
extended headers, padding and trailing blocks included — so a zip bomb is stopped after at most the
limit), an extended header (PAX, GNU long name) over MAX_EXTENDED_HEADER (checked from its declared size
before tarfile reads it, so a 200 MiB PAX header never sits in memory), a member name over
MAX_NAME_BYTES, and anything but zeros after the end-of-archive marker. A refused upload leaves no blob
and no row. Limits are installation settings (table submission_settings, names archive_*).
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

from tuneplane.app import db_functions as fn
from tuneplane.app.blobstore import BlobStore
from tuneplane.app.db import Database
from tuneplane.app.errors import Refusal, clip

CHUNK = 1024 * 1024
FIELD = "archive"
MAX_EXTENDED_HEADER = 1024 * 1024
MAX_NAME_BYTES = 4096
MAX_LINK_HOPS = 40
# What a client may label a source archive's body (or its multipart part) with: the gzip and tar family,
# and application/octet-stream for clients that label every binary that way.
ARCHIVE_TYPES = frozenset(
    {
        "application/gzip",
        "application/x-gzip",
        "application/x-tgz",
        "application/x-compressed-tar",
        "application/x-gtar",
        "application/x-tar",
        "application/octet-stream",
    }
)
_EXTENDED_HEADERS = frozenset(
    {
        tarfile.XHDTYPE,
        tarfile.XGLTYPE,
        tarfile.SOLARIS_XHDTYPE,
        tarfile.GNUTYPE_LONGNAME,
        tarfile.GNUTYPE_LONGLINK,
    }
)


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


def check_content_type(mimetype: str | None) -> None:
    """Refuse (415) a body not labelled as an archive: labelled as something else, or not labelled at all
    (an upload says what it is; a body without a Content-Type is not guessed at)."""
    if not mimetype:
        raise _refuse("it has no Content-Type (send application/gzip)", status=415)
    if mimetype.lower() not in ARCHIVE_TYPES:
        raise _refuse(
            f"its Content-Type is {clip(mimetype, 80)!r}, not an archive type (send application/gzip)",
            status=415,
        )


class _BoundedTarInfo(tarfile.TarInfo):
    """A TarInfo that refuses an oversized extended header from its declared size, before tarfile reads
    the whole header into memory (tarfile's own _proc_pax/_proc_gnulong read it in one piece)."""

    @classmethod
    def frombuf(cls, buf: bytes, encoding: str, errors: str) -> tarfile.TarInfo:
        # tarfile ends its iteration quietly at an invalid header after the first member; here that is
        # a refusal (something other than a member or the end-of-archive marker follows a member).
        try:
            return super().frombuf(buf, encoding, errors)
        except (tarfile.InvalidHeaderError, tarfile.TruncatedHeaderError) as exc:
            raise _refuse(f"it is not a valid tar stream: a damaged or foreign header ({exc})") from None

    def _proc_member(self, tarfile_: tarfile.TarFile) -> tarfile.TarInfo:  # type: ignore[override]
        if self.type in _EXTENDED_HEADERS and self.size > MAX_EXTENDED_HEADER:
            raise _refuse(
                f"an extended header (PAX or long name) declares {self.size} bytes; "
                f"at most {MAX_EXTENDED_HEADER} are allowed"
            )
        try:
            return super()._proc_member(tarfile_)  # type: ignore[misc]
        except tarfile.HeaderError as exc:  # raised by the header an extended header announces
            raise _refuse(
                f"member {clip(self.name, 200)!r} is an extended header (tar type {_type_name(self.type)}) "
                f"that no valid member header follows ({exc})"
            ) from None


def _type_name(kind: bytes) -> str:
    """A tar type flag as a reader can tell it apart (`'Z'`, `0x01`)."""
    char = kind.decode("latin-1") if kind else ""
    return repr(char) if char.isprintable() and char else f"0x{kind.hex() or '00'}"


def _too_big(limits: ArchiveLimits) -> ArchiveRefused:
    return _refuse(f"it expands to more than {limits.max_unpacked_bytes} bytes (the decompressed size limit)")


def _check_name(name: str) -> str:
    if not name or "\x00" in name:
        raise _refuse("a member has an empty or invalid name")
    if len(name.encode("utf-8", "surrogateescape")) > MAX_NAME_BYTES:
        raise _refuse(f"a member name is longer than {MAX_NAME_BYTES} bytes")
    if name.startswith("/") or (len(name) > 1 and name[1] == ":"):
        raise _refuse(f"member {name!r} has an absolute path")
    if ".." in name.split("/"):
        raise _refuse(f"member {name!r} has a '..' component")
    return posixpath.normpath(name)


def _escapes(path: str) -> bool:
    return path == ".." or path.startswith("../") or path.startswith("/")


def _check_member(member: tarfile.TarInfo, links: dict[str, str]) -> None:
    name = _check_name(member.name)
    if member.issym():
        if len(member.linkname) > MAX_NAME_BYTES:
            raise _refuse(f"symlink {clip(name, 200)!r} has a target longer than {MAX_NAME_BYTES} bytes")
        links[name] = member.linkname
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
        raise _refuse(
            f"member {clip(member.name, 200)!r} has tar type {_type_name(member.type)}, which is not a "
            "regular file, directory, symlink or hard link"
        )


def _resolve(path: str, links: dict[str, str]) -> str | None:
    """Where `path` (relative to the archive root) ends up once every symlink in it is followed, the way
    an extractor's filesystem would follow them; None when it leaves the root or loops."""
    pending = [part for part in path.split("/") if part not in ("", ".")]
    resolved: list[str] = []
    hops = 0
    while pending:
        part = pending.pop(0)
        if part == "..":
            if not resolved:
                return None
            resolved.pop()
            continue
        candidate = "/".join([*resolved, part])
        target = links.get(candidate)
        if target is None:
            resolved.append(part)
            continue
        hops += 1
        if hops > MAX_LINK_HOPS or target.startswith("/"):
            return None
        pending = [p for p in target.split("/") if p not in ("", ".")] + pending
    return "/".join(resolved)


def _check_link_chains(links: dict[str, str], names: list[str]) -> None:
    """Every symlink's target, and every member's directory, resolved through all the symlinks."""
    for name, target in links.items():
        parent = posixpath.dirname(name)
        if _resolve(posixpath.join(parent, target) if parent else target, links) is None:
            raise _refuse(f"symlink {clip(name, 200)!r} leads outside the archive through a chain of links")
    for name in names:
        parent = posixpath.dirname(name)
        if parent and _resolve(parent, links) is None:
            raise _refuse(f"member {clip(name, 200)!r} would be written through a link outside the archive")


def _check_trailer(archive: tarfile.TarFile) -> None:
    """Only zero blocks may follow the end-of-archive marker (tar pads its last record with them)."""
    stream = archive.fileobj
    assert stream is not None
    while chunk := stream.read(CHUNK):
        if chunk.count(0) != len(chunk):
            raise _refuse("it has data after the end-of-archive marker")


def validate_archive(path: str, limits: ArchiveLimits) -> tuple[int, int]:
    """(member count, declared unpacked bytes) of a safe tar.gz, or an ArchiveRefused saying why not."""
    members = 0
    unpacked = 0
    links: dict[str, str] = {}
    names: list[str] = []
    try:
        with gzip.open(path, "rb") as inflated:
            counter = _InflateCounter(inflated, limits)
            with tarfile.open(  # type: ignore[call-overload]
                fileobj=counter, mode="r|", tarinfo=_BoundedTarInfo
            ) as archive:
                for member in archive:
                    members += 1
                    if members > limits.max_members:
                        raise _refuse(f"it has more than {limits.max_members} members (the limit)")
                    _check_member(member, links)
                    names.append(posixpath.normpath(member.name))
                    unpacked += max(member.size, 0)
                    if unpacked > limits.max_unpacked_bytes:
                        raise _too_big(limits)
                _check_trailer(archive)
        _check_link_chains(links, names)
    except ArchiveRefused:
        raise
    except tarfile.TarError as exc:  # gzip was fine: what it holds is not a tar archive
        raise _refuse(f"the gzip stream does not hold a valid tar archive ({exc})") from exc
    except (gzip.BadGzipFile, zlib.error, EOFError, OSError) as exc:
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
        db.call(fn.record_source_archive, user_id, sha256, size, members, unpacked)
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
