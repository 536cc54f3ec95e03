"""The Job Capsule: the content-addressed bundle a member needs, built by the backend worker and verified
by the agent before anything of it is used.

Format: an uncompressed USTAR tar whose every entry is a regular file with mtime 0, mode 0644, owner
0:0 and no user/group names, in a fixed order, so the same job always yields the same bytes and the
same digest (sha256 of the whole tar). Entries:

    manifest.json               {"schema", "integration", "runtime", "source", "files": [{path, size, sha}]}
    spec.json                   the job's resolved spec (jobs.spec), canonical JSON
    runtime.json                the runtime pin, canonical JSON
    integration/<file>          the integration artifact's files, each equal to its pinned sha256
    source/archive.tar.gz       the source archive (source jobs only), equal to its pinned sha256

`manifest.files` lists every entry but the manifest, sorted by path. The agent checks the tar's digest
against the one the database recorded (PREPARE carries it), then every entry against the manifest, then
the integration files against the pin inside the spec (so a capsule cannot swap the integration either).
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import posixpath
import tarfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from tuneplane.app.submission.canonical import canonical_json, digest_of

SCHEMA = "tuneplane.capsule/v1"
MANIFEST = "manifest.json"
SPEC = "spec.json"
RUNTIME = "runtime.json"
SOURCE = "source/archive.tar.gz"
CHUNK = 1024 * 1024


class CapsuleError(Exception):
    """The capsule cannot be built or does not verify; the message says which part and why."""


@dataclass(frozen=True)
class CapsuleEntry:
    path: str
    size: int
    sha256: str
    # Where the bytes come from while building: in memory or a file (streamed, never read whole).
    data: bytes | None = None
    file: Path | None = None

    def open(self) -> BinaryIO:
        if self.data is not None:
            return io.BytesIO(self.data)
        assert self.file is not None
        return open(self.file, "rb")


def bytes_entry(path: str, data: bytes) -> CapsuleEntry:
    return CapsuleEntry(path, len(data), hashlib.sha256(data).hexdigest(), data=data)


def file_entry(path: str, file: Path, expected_sha256: str | None = None) -> CapsuleEntry:
    digest = hashlib.sha256()
    size = 0
    with open(file, "rb") as handle:
        while block := handle.read(CHUNK):
            digest.update(block)
            size += len(block)
    if expected_sha256 is not None and digest.hexdigest() != expected_sha256:
        raise CapsuleError(
            f"{path}: {file} has sha256 {digest.hexdigest()}, the job pinned {expected_sha256}"
        )
    return CapsuleEntry(path, size, digest.hexdigest(), file=file)


def integration_entry_point(pin: dict) -> str:
    """The integration file the runner executes: the module's own file when it is part of the artifact."""
    files = sorted(pin.get("files") or {})
    module_file = (pin.get("module") or "").rsplit(".", 1)[-1] + ".py"
    if module_file in files:
        return module_file
    if not files:
        raise CapsuleError(f"integration {pin.get('name')} pins no files")
    return files[0]


def manifest_for(spec: dict, entries: list[CapsuleEntry]) -> dict:
    integration = spec.get("integration") or {}
    source = (
        (spec.get("input") or {}).get("archive")
        if (spec.get("input") or {}).get("kind") == "source"
        else None
    )
    return {
        "schema": SCHEMA,
        "integration": {
            "name": integration.get("name"),
            "sha256": integration.get("sha256"),
            "entry": f"integration/{integration_entry_point(integration)}",
        },
        "runtime": spec.get("runtime"),
        "source": {"sha256": source["sha256"], "path": SOURCE} if source else None,
        "files": [{"path": e.path, "size": e.size, "sha256": e.sha256} for e in entries],
    }


def _tarinfo(path: str, size: int) -> tarfile.TarInfo:
    info = tarfile.TarInfo(path)
    info.size = size
    info.mtime = 0
    info.mode = 0o644
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    info.type = tarfile.REGTYPE
    return info


def write_capsule(spec: dict, entries: list[CapsuleEntry], out: BinaryIO) -> dict:
    """Write the capsule tar to `out`; returns its manifest. Entries are sorted here, not by the caller."""
    entries = sorted(entries, key=lambda e: e.path)
    paths = [e.path for e in entries]
    if len(set(paths)) != len(paths) or MANIFEST in paths:
        raise CapsuleError("capsule entries must have distinct paths other than manifest.json")
    manifest = manifest_for(spec, entries)
    manifest_bytes = canonical_json(manifest).encode()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        tar.addfile(_tarinfo(MANIFEST, len(manifest_bytes)), io.BytesIO(manifest_bytes))
        for entry in entries:
            with entry.open() as handle:
                tar.addfile(_tarinfo(entry.path, entry.size), handle)
    return manifest


def spec_entries(spec: dict) -> list[CapsuleEntry]:
    return [
        bytes_entry(SPEC, canonical_json(spec).encode()),
        bytes_entry(RUNTIME, canonical_json(spec.get("runtime") or {}).encode()),
    ]


# ---- the node's side --------------------------------------------------------------------------------


def file_digest(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(CHUNK):
            digest.update(block)
    return digest.hexdigest()


def _safe(path: str) -> bool:
    normal = posixpath.normpath(path)
    return (
        bool(path)
        and normal == path
        and not path.startswith("/")
        and ".." not in path.split("/")
        and "\\" not in path
    )


def _entries(tar: tarfile.TarFile) -> Iterator[tarfile.TarInfo]:
    for info in tar:
        if not info.isreg():
            raise CapsuleError(f"capsule entry {info.name!r} is not a regular file")
        if not _safe(info.name):
            raise CapsuleError(f"capsule entry {info.name!r} has an unsafe path")
        yield info


def unpack_capsule(tar_path: Path, expected_digest: str, dest: Path) -> dict:
    """Verify the tar against `expected_digest` and every entry against the manifest and the pins, then
    unpack into `dest` (which must not exist yet). Returns the manifest."""
    actual = file_digest(tar_path)
    if actual != expected_digest:
        raise CapsuleError(f"capsule digest mismatch: got {actual}, the launch recorded {expected_digest}")
    partial = dest.with_name(dest.name + ".partial")
    if partial.exists():
        import shutil

        shutil.rmtree(partial)
    partial.mkdir(parents=True)
    with tarfile.open(tar_path, mode="r:") as tar:
        entries = _entries(tar)
        first = next(entries, None)
        if first is None or first.name != MANIFEST:
            raise CapsuleError("capsule does not start with manifest.json")
        manifest_bytes = tar.extractfile(first).read()  # type: ignore[union-attr]
        manifest = json.loads(manifest_bytes)
        (partial / MANIFEST).write_bytes(manifest_bytes)
        if manifest.get("schema") != SCHEMA:
            raise CapsuleError(f"capsule schema {manifest.get('schema')!r} is not {SCHEMA}")
        expected = {f["path"]: f for f in manifest.get("files", [])}
        seen: set[str] = set()
        for info in entries:
            want = expected.get(info.name)
            if want is None or info.name in seen:
                raise CapsuleError(f"capsule entry {info.name} is not in its manifest (or repeated)")
            seen.add(info.name)
            target = partial / info.name
            target.parent.mkdir(parents=True, exist_ok=True)
            digest = hashlib.sha256()
            source = tar.extractfile(info)
            assert source is not None
            with open(target, "wb") as handle:
                while block := source.read(CHUNK):
                    digest.update(block)
                    handle.write(block)
            if digest.hexdigest() != want["sha256"] or info.size != want["size"]:
                raise CapsuleError(f"capsule entry {info.name} does not match its manifest")
        missing = sorted(set(expected) - seen)
        if missing:
            raise CapsuleError(f"capsule lacks {', '.join(missing)}")
    spec = json.loads((partial / SPEC).read_text())
    check_against_spec(manifest, spec, partial)
    os.replace(partial, dest)
    return manifest


def check_against_spec(manifest: dict, spec: dict, root: Path) -> None:
    """The integration files must be exactly the pinned artifact; runtime and source the pinned ones."""
    pin = spec.get("integration") or {}
    files = pin.get("files") or {}
    found = (
        {
            p.relative_to(root / "integration").as_posix(): file_digest(p)
            for p in (root / "integration").rglob("*")
            if p.is_file()
        }
        if (root / "integration").is_dir()
        else {}
    )
    if found != files or digest_of(files) != pin.get("sha256"):
        raise CapsuleError(
            f"integration {pin.get('name')} in the capsule differs from the artifact pinned by the job "
            f"(sha256 {pin.get('sha256')})"
        )
    if manifest.get("runtime") != spec.get("runtime"):
        raise CapsuleError("the capsule's runtime pin differs from the job's")
    input_doc = spec.get("input") or {}
    if input_doc.get("kind") == "source":
        want = (input_doc.get("archive") or {}).get("sha256")
        if not (root / SOURCE).is_file() or file_digest(root / SOURCE) != want:
            raise CapsuleError(f"the capsule's source archive is not the pinned sha256:{want}")
