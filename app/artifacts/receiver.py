"""The server side of artifact delivery: registration, chunk uploads, assembly and verification.

Framework-neutral (the Flask blueprint and the node gateway both call it). Each step is: check with the
database that the caller may do it (the stored functions authenticate the node credential), do the file
work, then record the result through a stored function. The database decides states; this module only
reports what it verified, and it records a file as verified only after hashing the bytes it now holds.

A file being uploaded is staged at <blob_dir>/staging/artifacts/<artifact id>/<digest prefix>/<file>.part;
each chunk is written in place at its offset and fsynced before it is recorded, so a recorded chunk whose
bytes are not on disk can only mean disk loss or tampering, which assembly detects (it re-checks every
chunk's sha256) and turns into a re-upload of exactly those chunks.
"""

from __future__ import annotations

import fcntl
import hashlib
import logging
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from psycopg.types.json import Jsonb

from app.artifacts.blobs import FsBlobStore
from app.db import Database
from app.errors import Refusal
from workers.artifacts.manifest import READ_BLOCK, Manifest, ManifestError, check_relative_path

log = logging.getLogger(__name__)

EMPTY_SHA256 = hashlib.sha256(b"").hexdigest()


@dataclass(frozen=True)
class Registration:
    member_id: int
    name: str
    manifest: dict
    manifest_digest: str
    kind: str = "output"
    delivery: str = "object"
    shared_path: str | None = None


class ArtifactReceiver:
    def __init__(self, db: Database, blob_dir: Path | str) -> None:
        self.db = db
        self.blob_dir = Path(blob_dir)
        self.blobs = FsBlobStore(self.blob_dir)

    # -- registration -------------------------------------------------------------------------------

    def register(self, credential_hash: str, reg: Registration) -> dict:
        """Register (or re-register, to resume) an artifact; verify what the server can verify already:
        empty files and files whose blob it holds (object), or every file on the shared path (shared)."""
        try:
            Manifest.from_json(reg.manifest)
        except ManifestError as exc:
            raise Refusal(str(exc), 400, "manifest") from exc
        row = self.db.call(
            "register_artifact",
            credential_hash,
            reg.member_id,
            reg.name,
            reg.kind,
            reg.delivery,
            Jsonb(reg.manifest),
            reg.manifest_digest,
            reg.shared_path,
        )[0]
        if row["state"] == "uploading":
            row = self._verify_known_files(credential_hash, row)
        return row

    def _verify_known_files(self, credential_hash: str, artifact: dict) -> dict:
        status = self.status(credential_hash, artifact["id"])
        problems: list[str] = []
        for entry in status["files"]:
            if entry["verified"]:
                continue
            if artifact["delivery"] == "shared":
                ok, problem = self._verify_shared_file(artifact, entry)
                if not ok:
                    problems.append(problem)
                    continue
            elif entry["size"] == 0:
                handle, tmp = self.blobs.temp_file()
                handle.close()
                self.blobs.put_verified(tmp, EMPTY_SHA256, 0)
            elif not self._blob_matches(entry["sha256"], entry["size"]):
                continue
            artifact = self.db.call(
                "record_artifact_file",
                credential_hash,
                artifact["id"],
                entry["index"],
                entry["sha256"],
                entry["size"],
            )[0]
        if problems and artifact["delivery"] == "shared":
            reason = f"shared files do not match the manifest: {'; '.join(problems[:20])}"
            artifact = self.db.call("fail_artifact", credential_hash, artifact["id"], reason)[0]
        return artifact

    def _blob_matches(self, sha256: str, size: int) -> bool:
        stream = self.blobs.open(sha256)
        if stream is None:
            return False
        with stream:
            actual_sha, actual_size = _hash_stream(stream)
        return actual_sha == sha256 and actual_size == size

    def _verify_shared_file(self, artifact: dict, entry: dict) -> tuple[bool, str]:
        path = shared_file_path(artifact["shared_path"], entry["path"])
        try:
            with open(path, "rb") as stream:
                sha, size = _hash_stream(stream)
        except FileNotFoundError:
            return False, f"missing: {entry['path']}"
        except OSError as exc:
            return False, f"unreadable: {entry['path']} ({exc.strerror})"
        if sha != entry["sha256"] or size != entry["size"]:
            return False, f"mismatch: {entry['path']}"
        return True, ""

    # -- uploads --------------------------------------------------------------------------------------

    def status(self, credential_hash: str, artifact_id: int) -> dict:
        return self.db.call("artifact_upload_status", credential_hash, artifact_id)[0][
            "artifact_upload_status"
        ]

    def put_chunk(
        self,
        credential_hash: str,
        artifact_id: int,
        file_index: int,
        chunk_index: int,
        data: bytes,
        claimed_sha256: str | None,
    ) -> dict:
        """Store one chunk after checking its sha256; assemble and verify the file once all chunks are in."""
        target = self.db.call(
            "artifact_upload_target", credential_hash, artifact_id, file_index, chunk_index, len(data)
        )[0]
        sha = hashlib.sha256(data).hexdigest()
        if claimed_sha256 is None:
            raise Refusal("each chunk needs its sha256 in the X-Chunk-Sha256 header", 400, "chunk")
        if sha != claimed_sha256.lower():
            raise Refusal(
                f"{target['path']}: chunk {chunk_index} has sha256 {sha}, "
                f"the uploader said {claimed_sha256}; send it again",
                422,
                "chunk",
            )
        if not target["verified"]:
            _write_at(self._staging_file(target), int(target["chunk_size"]) * chunk_index, data)
        recorded = self.db.call(
            "record_artifact_chunk", credential_hash, artifact_id, file_index, chunk_index, len(data), sha
        )[0]
        if recorded["file_verified"]:
            return {"file_verified": True, "state": self.status(credential_hash, artifact_id)["state"]}
        if recorded["all_chunks"]:
            artifact = self._assemble(credential_hash, target)
            return {"file_verified": True, "state": artifact["state"]}
        return {"file_verified": False, "state": "uploading"}

    def _staging_root(self, artifact_id: int) -> Path:
        return self.blob_dir / "staging" / "artifacts" / str(artifact_id)

    def _staging_file(self, target: dict) -> Path:
        return (
            self._staging_root(target["artifact_id"])
            / target["manifest_digest"][:16]
            / f"{target['file_index']}.part"
        )

    def _assemble(self, credential_hash: str, target: dict) -> dict:
        """Re-read the staged file chunk by chunk: every recorded chunk's sha256 and the whole file's are
        checked, and the file is recorded verified only if it matches the manifest. Bad chunks (lost or
        damaged on the server) are dropped so the uploader resends just those."""
        staged = self._staging_file(target)
        # Two last chunks arriving together both see "all chunks": one assembles, the other waits and
        # then finds the file verified (a lock file beside the staged file works across server processes).
        lock_path = staged.with_suffix(".lock")
        lock_path.parent.mkdir(parents=True, exist_ok=True)
        with open(lock_path, "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            status = self.status(credential_hash, target["artifact_id"])
            entry = next(f for f in status["files"] if f["index"] == target["file_index"])
            if entry["verified"]:
                return self.db.call("finish_artifact", credential_hash, target["artifact_id"])[0]
            return self._assemble_locked(credential_hash, target, staged)

    def _assemble_locked(self, credential_hash: str, target: dict, staged: Path) -> dict:
        chunks = self.db.call(
            "artifact_file_chunks", credential_hash, target["artifact_id"], target["file_index"]
        )
        chunk_size = int(target["chunk_size"])
        bad: list[int] = []
        digest = hashlib.sha256()
        size = 0
        try:
            with open(staged, "rb") as handle:
                for chunk in chunks:
                    handle.seek(chunk["chunk_index"] * chunk_size)
                    data = handle.read(chunk["size"])
                    if len(data) != chunk["size"] or hashlib.sha256(data).hexdigest() != chunk["sha256"]:
                        bad.append(chunk["chunk_index"])
                        continue
                    digest.update(data)
                    size += len(data)
                os.fsync(handle.fileno())
        except FileNotFoundError:
            bad = [c["chunk_index"] for c in chunks]
        if bad:
            self.db.call(
                "discard_artifact_chunks",
                credential_hash,
                target["artifact_id"],
                target["file_index"],
                bad,
                f"{target['path']}: staged chunks {bad[:20]} were lost or damaged on the server; resend them",
            )
            raise Refusal(f"{target['path']}: chunks {bad[:20]} must be sent again", 409, "chunk")
        if digest.hexdigest() != target["sha256"] or size != target["size"]:
            staged.unlink(missing_ok=True)
            reason = (
                f"{target['path']}: the uploaded bytes ({size} bytes, sha256 {digest.hexdigest()}) "
                f"do not match the manifest ({target['size']} bytes, sha256 {target['sha256']}); "
                "all its chunks were dropped"
            )
            self.db.call(
                "discard_artifact_chunks",
                credential_hash,
                target["artifact_id"],
                target["file_index"],
                None,
                reason,
            )
            raise Refusal(reason, 409, "file")
        self.blobs.adopt_hashed(staged, target["sha256"])
        artifact = self.db.call(
            "record_artifact_file",
            credential_hash,
            target["artifact_id"],
            target["file_index"],
            target["sha256"],
            target["size"],
        )[0]
        if artifact["state"] == "complete":
            shutil.rmtree(self._staging_root(target["artifact_id"]), ignore_errors=True)
        return artifact

    def finish(self, credential_hash: str, artifact_id: int) -> dict:
        artifact = self.db.call("finish_artifact", credential_hash, artifact_id)[0]
        if artifact["state"] == "uploading":
            # Files whose blobs arrived but whose record was lost (a crash between the two) verify here.
            artifact = self._verify_known_files(credential_hash, artifact)
            if artifact["state"] == "uploading":
                artifact = self.db.call("finish_artifact", credential_hash, artifact_id)[0]
        return artifact

    def fail(self, credential_hash: str, artifact_id: int, reason: str) -> dict:
        artifact = self.db.call("fail_artifact", credential_hash, artifact_id, reason)[0]
        shutil.rmtree(self._staging_root(artifact_id), ignore_errors=True)
        return artifact


def shared_file_path(shared_dir: str, relative: str) -> Path:
    check_relative_path(relative)
    return Path(shared_dir) / relative


def _hash_stream(stream: Any) -> tuple[str, int]:
    digest = hashlib.sha256()
    size = 0
    while block := stream.read(READ_BLOCK):
        digest.update(block)
        size += len(block)
    return digest.hexdigest(), size


def _write_at(path: Path, offset: int, data: bytes) -> None:
    """Write a chunk in place in the file's staging copy and make it durable before it is recorded."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        os.pwrite(fd, data, offset)
        os.fsync(fd)
    finally:
        os.close(fd)
