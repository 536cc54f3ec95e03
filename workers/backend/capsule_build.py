"""Building a job's capsule on the worker and storing it in the blob store under its digest.

The integration files are read from the integration package installed next to the worker and must hash
to the job's pin (a worker with another version of an integration refuses rather than launching code the
user did not preview). The source archive comes from the blob store it was uploaded to.

Built once per spec: the same resolved spec always yields the same capsule bytes, so the blob store keeps
an index `capsules/by-spec/<sha256 of the canonical spec>` → capsule digest. A builder takes an exclusive
flock on that spec's lock file, uses the indexed capsule when its blob is there, and builds (and indexes)
it otherwise. Two launches of one attempt (the worker's direct launch and the queued one, or two workers
sharing the blob store) therefore write the capsule once; the second waits for the first and reuses it.

A job on a fleet whose store is S3 gets its capsule written there (staged in a temporary file, never under
the server's blob directory) and its nodes fetch it with a presigned GET (app/node_gateway/launch.py).
"""

from __future__ import annotations

import fcntl
import importlib.util
import os
import shutil
import tempfile
from pathlib import Path

from tuneplane.app.blobstore import BlobStore, FilesystemBlobStore, file_sha256
from tuneplane.app.submission.canonical import digest_of
from tuneplane.workers.capsule import CapsuleEntry, CapsuleError, file_entry, spec_entries, write_capsule


def integration_dir(pin: dict) -> Path:
    module = pin.get("module") or ""
    package = module.rsplit(".", 1)[0] if "." in module else "tuneplane.workers.integrations"
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise CapsuleError(f"integration {pin.get('name')}: package {package} is not installed on the worker")
    return Path(next(iter(spec.submodule_search_locations)))


def integration_entries(pin: dict) -> list[CapsuleEntry]:
    files = pin.get("files") or {}
    if not files or digest_of(files) != pin.get("sha256"):
        raise CapsuleError(f"integration {pin.get('name')}: the pin's files do not hash to its sha256")
    base = integration_dir(pin)
    entries = []
    for name, sha in sorted(files.items()):
        path = base / name
        if not path.is_file():
            raise CapsuleError(f"integration {pin.get('name')}: {name} is missing on the worker")
        try:
            entries.append(file_entry(f"integration/{name}", path, sha))
        except CapsuleError as exc:
            raise CapsuleError(
                f"integration {pin.get('name')}: the worker's {name} differs from the pinned artifact ({exc})"
            ) from exc
    return entries


def capsule_entries(
    spec: dict, blobs: FilesystemBlobStore, store: BlobStore | None = None, scratch: Path | None = None
) -> list[CapsuleEntry]:
    """The capsule's files. The source archive comes from the server's blob store, or from `store` (an S3
    fleet's, where `POST /sources?fleet=` put it), copied into `scratch` first; file_entry checks its
    sha256 either way, so bytes the store changed never enter a capsule."""
    entries = spec_entries(spec) + integration_entries(spec.get("integration") or {})
    input_doc = spec.get("input") or {}
    if input_doc.get("kind") == "source":
        sha = (input_doc.get("archive") or {}).get("sha256") or ""
        try:
            path = blobs.path(sha)
        except ValueError as exc:
            raise CapsuleError(f"source archive: {exc}") from exc
        if not path.is_file() and store is not None and scratch is not None and store.exists(sha):
            path = scratch / "archive.tar.gz"
            with store.open(sha) as source, open(path, "wb") as copy:
                shutil.copyfileobj(source, copy, 1024 * 1024)
        if not path.is_file():
            raise CapsuleError(f"source archive sha256:{sha} is not in the blob store {blobs.root}")
        entries.append(file_entry("source/archive.tar.gz", path, sha))
    return entries


def build_capsule(spec: dict, blobs: FilesystemBlobStore, store: BlobStore | None = None) -> str:
    """The capsule's digest, writing it into `store` (an S3 fleet's: app/s3store.py) or else the server's
    blob store, atomically under its digest, unless this spec's capsule is already there (see the module
    doc: once per spec, under a per-spec flock; the index lives with the server's store either way, and the
    same spec gives the same bytes whichever store holds them)."""
    target: BlobStore = store if store is not None else blobs
    index = blobs.root / "capsules" / "by-spec" / digest_of(spec)
    index.parent.mkdir(parents=True, exist_ok=True)
    with open(f"{index}.lock", "a+b") as lock:
        fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
        try:
            known = index.read_text().strip() if index.is_file() else ""
            if known and target.exists(known):
                if store is None:
                    # Reused: refresh its time, as commit_staged does, so blob GC (which keeps recent
                    # blobs) cannot remove it before begin_prepare records it.
                    os.utime(blobs.path(known))
                return known
            digest = _write_capsule_blob(spec, blobs, target)
            staged = index.with_name(f"{index.name}.{os.getpid()}.tmp")
            staged.write_text(digest)
            os.replace(staged, index)
            return digest
        finally:
            fcntl.flock(lock.fileno(), fcntl.LOCK_UN)


def _write_capsule_blob(spec: dict, blobs: FilesystemBlobStore, target: BlobStore) -> str:
    store = None if target is blobs else target
    with tempfile.TemporaryDirectory(prefix="tp-capsule-") as scratch, target.stage() as (staged, handle):
        entries = capsule_entries(spec, blobs, store, Path(scratch))
        write_capsule(spec, entries, handle)
        handle.flush()
        digest = file_sha256(staged)
        target.commit_staged(staged, digest)
    return digest
