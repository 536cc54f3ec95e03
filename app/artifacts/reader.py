"""Reading an artifact's stored files back: for downloads (streamed, hashed on the way out) and for
verification (every file recomputed against the manifest). Object delivery reads the blob store, shared
delivery the fleet's shared path."""

from __future__ import annotations

import hashlib
import io
import logging
import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import BinaryIO

from tuneplane.app import db_functions as fn
from tuneplane.app.artifacts.blobs import FsBlobStore
from tuneplane.app.artifacts.receiver import shared_file_path
from tuneplane.app.db import Database
from tuneplane.app.errors import Refusal
from tuneplane.app.s3store import S3Store
from tuneplane.workers.artifacts.manifest import READ_BLOCK, Manifest
from tuneplane.workers.artifacts.verify import VerifyReport, verify_with

log = logging.getLogger(__name__)


class S3Blobs:
    """An S3 fleet's artifact files read the way the filesystem store's blobs are (`open_file` gives None for
    a missing object), so verification streams each object from the store once and hashes it here, off the
    node. `names`: each file's object under the store's prefix, by manifest path (artifact_file_list's
    object_key: tuneplane.artifact_object_key decides)."""

    def __init__(self, store: S3Store, names: Mapping[str, str]) -> None:
        self.store = store
        self.names = names

    @classmethod
    def of_artifact(cls, db: Database, store: S3Store, artifact_id: int) -> S3Blobs:
        rows = db.call(fn.artifact_file_list, artifact_id)
        return cls(store, {row["path"]: row["object_key"] for row in rows})

    def open_file(self, entry: dict) -> BinaryIO | None:
        """The object's bytes; None when the store says it does not exist. A store that fails to answer
        (unreachable, 5xx, keys refused, bucket gone) proves nothing about the bytes: 503 (store_failure),
        never "unreadable", which a verification would record as a corrupt artifact."""
        from botocore.exceptions import BotoCoreError, ClientError

        if entry["size"] == 0:  # an empty file has no object (nothing was uploaded)
            return io.BytesIO(b"")
        name = self.names.get(entry["path"])
        if name is None:
            return None
        try:
            return self.store.open_key(self.store.key(name))
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") in ("404", "NoSuchKey", "NotFound"):
                return None
            raise store_failure(self.store, exc) from exc
        except BotoCoreError as exc:
            raise store_failure(self.store, exc) from exc


def store_failure(store: S3Store, exc: Exception) -> Refusal:
    """503 naming the store and what it said: nothing was read, so nothing is marked; try again later."""
    where = store.location.url + (f" at {store.location.endpoint}" if store.location.endpoint else "")
    return Refusal(
        f"the object store {where} did not answer ({type(exc).__name__}: {exc}); nothing was marked: "
        "try again once it answers (docs/runbook.md, S3 stores)",
        503,
        "storage",
    )


class StoredBytesMismatch(RuntimeError):
    """Raised mid-stream when the bytes sent do not hash to the manifest entry (the response is cut)."""


def open_stored(blobs: FsBlobStore | S3Blobs, artifact: dict, entry: dict) -> BinaryIO | None:
    """The stored bytes of one manifest entry, or None when they are missing."""
    if artifact["delivery"] == "shared":
        try:
            return open(shared_file_path(artifact["shared_path"], entry["path"]), "rb")
        except (FileNotFoundError, NotADirectoryError):
            return None
    if isinstance(blobs, S3Blobs):
        return blobs.open_file(entry)
    return blobs.open(entry["sha256"])


def verify_stored(blobs: FsBlobStore | S3Blobs, artifact: dict) -> VerifyReport:
    """Recompute every file of the artifact from the bytes the server holds or reads."""
    manifest = Manifest.from_json(artifact["manifest"])
    by_path = {f.path: {"path": f.path, "sha256": f.sha256, "size": f.size} for f in manifest.files}
    present: list[str] = []
    if artifact["delivery"] == "shared" and Path(artifact["shared_path"]).is_dir():
        root = artifact["shared_path"]
        for dirpath, _dirs, names in os.walk(root):
            for name in names:
                present.append(os.path.relpath(os.path.join(dirpath, name), root).replace(os.sep, "/"))
    # Extra files next to a shared artifact are not part of it; they are listed, not counted as failures.
    return verify_with(
        manifest, lambda p: open_stored(blobs, artifact, by_path[p]), present, allow_extra=True
    )


def stream_verified(stream: BinaryIO, entry: dict, label: str) -> Iterator[bytes]:
    """Yield the file's bytes, holding the last block back until the whole file's sha256 is known, so a
    client never receives a complete-looking body for bytes that do not match the manifest."""
    digest = hashlib.sha256()
    size = 0
    pending: bytes | None = None
    with stream:
        while block := stream.read(READ_BLOCK):
            digest.update(block)
            size += len(block)
            if pending is not None:
                yield pending
            pending = block
    if digest.hexdigest() != entry["sha256"] or size != entry["size"]:
        log.error("%s: stored bytes do not match the manifest; download cut", label)
        raise StoredBytesMismatch(f"{label}: stored bytes do not match the manifest")
    if pending is not None:
        yield pending
