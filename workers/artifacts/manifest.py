"""Artifact manifests: relative path, size and sha256 of every file, and the manifest's own digest.

The canonical form is compact JSON with sorted keys, files sorted by path (code point order) and UTF-8
text: `{"files":[{"path":"a.bin","sha256":"…","size":3}],"version":1}`. Its sha256 is the manifest
digest. The database recomputes the same text from the stored jsonb (`artifact_manifest_canonical` in
sql/migrations/0050_artifacts.sql), so paths are restricted to what both sides escape identically:
valid UTF-8 without control characters, relative POSIX form, no `.`/`..`/empty components.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import stat
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

MANIFEST_VERSION = 1
READ_BLOCK = 1024 * 1024
HASH_BLOCK = 4 * 1024 * 1024
MAX_PATH_LENGTH = 4096
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


EMPTY_SHA256 = hashlib.sha256(b"").hexdigest()


class ManifestError(ValueError):
    """The directory or the manifest cannot be made into (or read as) a valid manifest; names the path."""


def hash_file(path: Path | str) -> tuple[str, int]:
    """(sha256 hex, size) of the bytes actually read, so a file growing meanwhile cannot disagree.
    Reads into one reused buffer (no allocation per block); hashlib releases the GIL while it hashes, so
    several files hash in parallel threads."""
    digest = hashlib.sha256()
    size = 0
    buffer = bytearray(HASH_BLOCK)
    view = memoryview(buffer)
    with open(path, "rb", buffering=0) as handle:
        while n := handle.readinto(buffer):
            digest.update(view[:n])
            size += n
    return digest.hexdigest(), size


def check_relative_path(path: str) -> str:
    """The path itself if it is a safe relative POSIX path, else ManifestError naming it."""
    if not isinstance(path, str) or path == "":
        raise ManifestError("a manifest path is empty")
    if len(path) > MAX_PATH_LENGTH:
        raise ManifestError(f"{path[:80]}…: path longer than {MAX_PATH_LENGTH} characters")
    if _CONTROL.search(path):
        raise ManifestError(f"{path!r}: control characters are not allowed in artifact paths")
    try:
        path.encode("utf-8")
    except UnicodeEncodeError:
        # A name that is not UTF-8 on disk arrives as lone surrogates (os.fsdecode); the manifest's canonical
        # text is UTF-8, so it cannot be described. Named by its bytes.
        raise ManifestError(
            f"{os.fsencode(path)!r}: the name is not valid UTF-8; artifact paths must be UTF-8"
        ) from None
    if path.startswith("/"):
        raise ManifestError(f"{path}: absolute paths are not allowed")
    if any(part in ("", ".", "..") for part in path.split("/")):
        raise ManifestError(f"{path}: empty, '.' and '..' components are not allowed")
    return path


def normalize_digest(value: str) -> str:
    """A manifest digest as 64 lowercase hex characters (accepts a `sha256:` prefix)."""
    text = value.strip().lower()
    if text.startswith("sha256:"):
        text = text[len("sha256:") :]
    if not _SHA256.match(text):
        raise ManifestError(f"{value!r} is not a sha256 digest (64 hex characters, optionally sha256:…)")
    return text


@dataclass(frozen=True)
class ManifestFile:
    path: str
    size: int
    sha256: str

    def as_json(self) -> dict:
        return {"path": self.path, "sha256": self.sha256, "size": self.size}


@dataclass(frozen=True)
class Manifest:
    files: tuple[ManifestFile, ...]

    def __post_init__(self) -> None:
        ordered = tuple(sorted(self.files, key=lambda f: f.path))
        object.__setattr__(self, "files", ordered)
        seen: set[str] = set()
        for item in ordered:
            check_relative_path(item.path)
            if item.path in seen:
                raise ManifestError(f"{item.path}: listed twice")
            seen.add(item.path)
            if not isinstance(item.size, int) or isinstance(item.size, bool) or item.size < 0:
                raise ManifestError(f"{item.path}: size must be a non-negative integer")
            if not isinstance(item.sha256, str) or not _SHA256.match(item.sha256):
                raise ManifestError(f"{item.path}: sha256 must be 64 lowercase hex characters")
            if item.size == 0 and item.sha256 != EMPTY_SHA256:
                raise ManifestError(f"{item.path}: an empty file's sha256 is {EMPTY_SHA256}")
        # A file and a directory of the same name cannot both exist on disk.
        for item in ordered:
            parent = item.path.rsplit("/", 1)[0] if "/" in item.path else None
            while parent:
                if parent in seen:
                    raise ManifestError(f"{parent}: listed as a file and used as a directory")
                parent = parent.rsplit("/", 1)[0] if "/" in parent else None

    def as_json(self) -> dict:
        return {"files": [f.as_json() for f in self.files], "version": MANIFEST_VERSION}

    def canonical_bytes(self) -> bytes:
        return canonical_json(self.as_json())

    @property
    def digest(self) -> str:
        return hashlib.sha256(self.canonical_bytes()).hexdigest()

    def by_path(self) -> dict[str, ManifestFile]:
        return {f.path: f for f in self.files}

    @classmethod
    def from_json(cls, data: dict | str | bytes) -> Manifest:
        if isinstance(data, str | bytes):
            try:
                data = json.loads(data)
            except ValueError as exc:
                raise ManifestError(f"manifest is not JSON: {exc}") from exc
        if not isinstance(data, dict) or data.get("version") != MANIFEST_VERSION:
            raise ManifestError(f"manifest must be an object with version {MANIFEST_VERSION}")
        if set(data) != {"files", "version"}:
            raise ManifestError(f"manifest has unknown keys: {sorted(set(data) - {'files', 'version'})}")
        files = data.get("files")
        if not isinstance(files, list):
            raise ManifestError("manifest files must be a list")
        items = []
        for entry in files:
            if not isinstance(entry, dict) or set(entry) != {"path", "sha256", "size"}:
                raise ManifestError(f"manifest entry must have exactly path, sha256 and size: {entry!r}")
            items.append(ManifestFile(entry["path"], entry["size"], entry["sha256"]))
        return cls(tuple(items))


def canonical_json(data: object) -> bytes:
    return json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def _inside(root_real: str, candidate: str) -> bool:
    return candidate == root_real or candidate.startswith(root_real.rstrip(os.sep) + os.sep)


def walk_files(root: Path | str) -> Iterator[tuple[str, Path]]:
    """(relative POSIX path, absolute path) of every regular file under root.

    Symlinks are followed only while they resolve inside root; one that escapes (or a cycle, or a
    device, socket or FIFO) raises ManifestError naming it, so a manifest never describes bytes that
    live outside the artifact directory.
    """
    root_path = Path(root)
    if not root_path.is_dir():
        raise ManifestError(f"{root}: not a directory")
    root_real = os.path.realpath(root_path)

    def visit(directory: Path, rel_prefix: str, ancestors: frozenset[str]) -> Iterator[tuple[str, Path]]:
        with os.scandir(directory) as entries:
            names = sorted(entries, key=lambda e: e.name)
        for entry in names:
            rel = f"{rel_prefix}{entry.name}"
            full = Path(entry.path)
            if entry.is_symlink():
                target = os.path.realpath(full)
                if not _inside(root_real, target):
                    raise ManifestError(f"{rel}: symlink points outside the artifact directory ({target})")
                if not os.path.exists(target):
                    raise ManifestError(f"{rel}: dangling symlink")
            mode = os.stat(full).st_mode
            if stat.S_ISDIR(mode):
                real = os.path.realpath(full)
                if real in ancestors:
                    raise ManifestError(f"{rel}: symlink loop")
                yield from visit(full, rel + "/", ancestors | {real})
            elif stat.S_ISREG(mode):
                check_relative_path(rel)
                yield rel, full
            else:
                raise ManifestError(f"{rel}: not a regular file or directory")

    yield from visit(root_path, "", frozenset({root_real}))


def build_manifest(root: Path | str, *, parallel: int | None = None) -> Manifest:
    """Hash every file under root into a Manifest, `parallel` files at a time (default: one per CPU, at
    most 8), so a directory of shards is hashed at the speed of the disk rather than of one core."""
    entries = list(walk_files(root))
    workers = parallel or min(8, os.cpu_count() or 1)
    if workers <= 1 or len(entries) <= 1:
        hashed = [hash_file(full) for _rel, full in entries]
    else:
        with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="manifest-hash") as pool:
            hashed = list(pool.map(hash_file, [full for _rel, full in entries]))
    return Manifest(
        tuple(ManifestFile(rel, size, sha) for (rel, _full), (sha, size) in zip(entries, hashed, strict=True))
    )
