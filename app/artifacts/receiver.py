"""The server side of artifact delivery: registration, chunk uploads, assembly and verification.

Framework-neutral (the Flask blueprint and the node gateway both call it). Each step is: check with the
database that the caller may do it (the stored functions authenticate the node credential), do the file
work, then record the result through a stored function. The database decides states; this module only
reports what it verified, and it records a file as verified only after hashing the bytes it now holds.

A file being uploaded is staged at <blob_dir>/staging/artifacts/<artifact id>/<digest prefix>/<file>.part;
each chunk is written in place at its offset (after its crc32c or sha256 matched) and then recorded.
Chunks that arrive in order extend the file's sha256 as they are written (app/artifacts/staged_hash.py).
The file is fsynced once, when it is assembled: the part of it not hashed on arrival (all of it after a
restart, or when the staged file was changed by anyone else) is read back, each chunk re-checked against
its recorded digest in the same pass that completes the file's sha256; a recorded chunk whose bytes a
crash lost, or that the disk or someone damaged, is turned into a re-upload of exactly those chunks.
"""

from __future__ import annotations

import base64
import binascii
import fcntl
import hashlib
import logging
import os
import shutil
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import google_crc32c
from psycopg.types.json import Jsonb

from tuneplane.app import db_functions as fn
from tuneplane.app.artifacts.blobs import FsBlobStore
from tuneplane.app.artifacts.gc import gc_lock
from tuneplane.app.artifacts.staged_hash import STAGED_HASHES, StagedWriter, trusted_prefix
from tuneplane.app.db import Database
from tuneplane.app.errors import Refusal
from tuneplane.workers.artifacts.manifest import READ_BLOCK, Manifest, ManifestError, check_relative_path
from tuneplane.workers.artifacts.upload import INLINE_MAX_BYTES, INLINE_MAX_FILES

log = logging.getLogger(__name__)

# The largest chunk_size artifact_settings allows (its CHECK): no chunk body is ever larger, so the HTTP
# layers refuse a bigger one before reading it (and size their body limits to it).
MAX_CHUNK_BYTES = 256 * 1024 * 1024


@dataclass(frozen=True)
class Registration:
    member_id: int
    name: str
    manifest: dict
    manifest_digest: str
    kind: str = "output"
    delivery: str = "object"
    shared_path: str | None = None
    step: int | None = None  # a checkpoint's training step, as the workload said it (None: not said)
    # A small artifact's files sent with the registration (path → bytes; object delivery only): each one
    # whose bytes hash to its manifest entry is verified at once, the others are left to the chunk upload.
    inline: dict[str, bytes] | None = None


def inline_from_json(value: object) -> dict[str, bytes] | None:
    """The registration's `inline` ({path: base64 of the file's bytes}), decoded; refused (naming `inline`)
    when it is not such an object, a value is not base64, or it holds more than the inline limits."""
    if value is None:
        return None
    if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
        raise Refusal("inline must be an object of file path → the file's bytes in base64", 400, "inline")
    if len(value) > INLINE_MAX_FILES:
        raise Refusal(f"inline holds {len(value)} files, at most {INLINE_MAX_FILES}", 413, "inline")
    too_large = f"inline holds more than {INLINE_MAX_BYTES} bytes; upload the files in chunks"
    # Measured on the text before decoding anything (base64: 3 bytes in 4 characters), then exactly.
    if sum(len(v) for v in value.values()) // 4 * 3 > INLINE_MAX_BYTES + 2 * len(value):
        raise Refusal(too_large, 413, "inline")
    decoded = {}
    for path, text in value.items():
        try:
            decoded[path] = base64.b64decode(text, validate=True)
        except (binascii.Error, ValueError) as exc:
            raise Refusal(f"inline: the bytes of {path!r} are not base64 ({exc})", 400, "inline") from exc
    if sum(len(data) for data in decoded.values()) > INLINE_MAX_BYTES:
        raise Refusal(too_large, 413, "inline")
    return decoded


def registration_from_json(body: object) -> Registration:
    """The registration a node agent sent (`POST /api/artifacts`, on the server and the node gateway
    alike), refused with the field that is missing or of the wrong type."""
    if not isinstance(body, dict):
        raise Refusal("the request body must be a JSON object", 400, "body")
    for field in ("member_id", "name", "manifest", "manifest_digest"):
        if field not in body:
            raise Refusal(f"{field} is required", 400, field)
    if not isinstance(body["member_id"], int) or isinstance(body["member_id"], bool):
        raise Refusal("member_id must be an integer", 400, "member_id")
    if not isinstance(body["manifest"], dict):
        raise Refusal("manifest must be an object", 400, "manifest")
    for field in ("name", "manifest_digest", "kind", "delivery", "shared_path"):
        value = body.get(field)
        if value is not None and not isinstance(value, str):
            raise Refusal(f"{field} must be a string", 400, field)
    step = body.get("step")
    if step is not None and (not isinstance(step, int) or isinstance(step, bool)):
        raise Refusal("step must be an integer", 400, "step")
    return Registration(
        member_id=body["member_id"],
        name=body["name"],
        manifest=body["manifest"],
        manifest_digest=body["manifest_digest"],
        kind=body.get("kind") or "output",
        delivery=body.get("delivery") or "object",
        shared_path=body.get("shared_path"),
        step=step,
        inline=inline_from_json(body.get("inline")),
    )


@dataclass(frozen=True)
class Refused:
    member_id: int
    name: str
    kind: str
    reason: str


def refused_from_json(body: object) -> Refused:
    """An agent's `POST /api/artifacts/refused` body ({"member_id", "name", "kind"?, "reason"}): an output
    it cannot deliver, recorded failed with the reason; refused naming the field that is wrong."""
    if not isinstance(body, dict):
        raise Refusal("the request body must be a JSON object", 400, "body")
    member_id = body.get("member_id")
    if not isinstance(member_id, int) or isinstance(member_id, bool) or not 0 < member_id < 2**63:
        raise Refusal("member_id must be a member's id", 400, "member_id")
    for field in ("name", "reason"):
        if not isinstance(body.get(field), str):
            raise Refusal(f"{field} must be a string", 400, field)
    kind = body.get("kind", "output")
    if not isinstance(kind, str):
        raise Refusal("kind must be a string", 400, "kind")
    return Refused(body["member_id"], body["name"], kind, body["reason"])


def fail_reason_from_json(body: object) -> str:
    """The reason in an agent's `POST /api/artifacts/<id>/fail` body ({"reason": "…"}, may be empty)."""
    if not isinstance(body, dict):
        raise Refusal("the request body must be a JSON object", 400, "body")
    reason = body.get("reason")
    if reason is not None and not isinstance(reason, str):
        raise Refusal("reason must be a string", 400, "reason")
    return reason or ""


class ArtifactReceiver:
    def __init__(self, db: Database, blob_dir: Path | str) -> None:
        self.db = db
        self.blob_dir = Path(blob_dir)
        self.blobs = FsBlobStore(self.blob_dir)

    # -- registration -------------------------------------------------------------------------------

    def register(self, credential_hash: str, reg: Registration) -> dict:
        """Register (or re-register, to resume) an artifact; verify what the server can verify already:
        empty files, files whose blob it holds and files sent inline (object), or every file on the shared
        path (shared)."""
        try:
            manifest = Manifest.from_json(reg.manifest)
        except ManifestError as exc:
            raise Refusal(str(exc), 400, "manifest") from exc
        if reg.inline:
            if reg.delivery != "object":
                raise Refusal("inline files are for object delivery only", 400, "inline")
            unknown = sorted(set(reg.inline) - set(manifest.by_path()))
            if unknown:
                raise Refusal(f"inline: {unknown[0]!r} is not a file of the manifest", 400, "inline")
        row = self.db.call(
            fn.register_artifact,
            credential_hash,
            reg.member_id,
            reg.name,
            reg.kind,
            reg.delivery,
            Jsonb(reg.manifest),
            reg.manifest_digest,
            reg.shared_path,
            reg.step,
        )[0]
        if row["state"] == "uploading":
            row = self._verify_known_files(credential_hash, row, reg.inline)
        return row

    def _verify_known_files(
        self, credential_hash: str, artifact: dict, inline: dict[str, bytes] | None = None
    ) -> dict:
        """Record verified every file the server can vouch for without an upload: its blob is held already,
        it is empty, or its bytes came inline and hash to its manifest entry (put_verified re-hashes)."""
        inline = inline or {}
        status = self.status(credential_hash, artifact["id"])
        problems: list[str] = []
        # A fleet with an S3 store: no byte lands in the server's store, inline ones are ignored (the agent
        # then uploads them to the store directly, app/artifacts/s3_delivery.py); an empty file needs none.
        direct = (status.get("storage") or {}).get("kind") == "s3" and artifact["delivery"] == "object"
        if direct:  # bytes another artifact in that store holds verified already are not sent again
            artifact = self.db.call(fn.reuse_artifact_objects, credential_hash, artifact["id"])[0]
            status = self.status(credential_hash, artifact["id"])
        for entry in status["files"]:
            if entry["verified"]:
                continue
            if direct:
                if entry["size"] == 0:
                    artifact = self._record_file(credential_hash, artifact["id"], entry)
                continue
            if artifact["delivery"] == "shared":
                ok, problem = self._verify_shared_file(artifact, entry)
                if not ok:
                    problems.append(problem)
                    continue
                artifact = self._record_file(credential_hash, artifact["id"], entry)
                continue
            # Placing or finding the blob and recording the file that uses it happen under the gc lock, so
            # a collection cannot remove the blob in between (app/artifacts/gc.py).
            with gc_lock(self.blob_dir, exclusive=False):
                if not self._blob_matches(entry["sha256"], entry["size"]):
                    data = b"" if entry["size"] == 0 else inline.get(entry["path"])
                    if data is None or not self.blobs.put_bytes(data, entry["sha256"]):
                        continue  # not held, or inline bytes that do not match: the chunk upload sends it
                artifact = self._record_file(credential_hash, artifact["id"], entry)
        if problems and artifact["delivery"] == "shared":
            reason = f"shared files do not match the manifest: {'; '.join(problems[:20])}"
            artifact = self.db.call(fn.fail_artifact, credential_hash, artifact["id"], reason)[0]
        return artifact

    def _record_file(self, credential_hash: str, artifact_id: int, entry: dict) -> dict:
        return self.db.call(
            fn.record_artifact_file,
            credential_hash,
            artifact_id,
            entry["index"],
            entry["sha256"],
            entry["size"],
        )[0]

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
        return self.db.call(fn.artifact_upload_status, credential_hash, artifact_id)[0][
            "artifact_upload_status"
        ]

    def put_chunk(
        self,
        credential_hash: str,
        artifact_id: int,
        file_index: int,
        chunk_index: int,
        data: bytes | ChunkBody,
        claimed_sha256: str | None,
        claimed_crc32c: str | None = None,
    ) -> dict:
        """Store one chunk after checking its digest (crc32c, or sha256 from older agents); assemble and
        verify the file once all its chunks are in. `data` is the chunk, or a ChunkBody streaming it."""
        body = data if isinstance(data, ChunkBody) else ChunkBody.of(data)
        if claimed_crc32c is None and claimed_sha256 is None:
            raise Refusal(
                "each chunk needs its crc32c (X-Chunk-Crc32c) or sha256 (X-Chunk-Sha256)", 400, "chunk"
            )
        target = self.db.call(
            fn.artifact_upload_target, credential_hash, artifact_id, file_index, chunk_index, body.length
        )[0]
        staged = None if target["verified"] else self._staging_file(target)
        # Streamed into place while its digest is computed: bytes that then fail the check are never
        # recorded (and a resend overwrites them). A chunk that continues the file in order also extends
        # the file's sha256 (app/artifacts/staged_hash.py), so assembly need not read those bytes again.
        offset = int(target["chunk_size"]) * chunk_index
        want_sha256 = claimed_sha256 is not None and claimed_crc32c is None
        writer = None
        try:
            sha, crc, writer = _receive(body, staged, offset, want_sha256)
            check_chunk_digest(target["path"], chunk_index, sha, crc, claimed_sha256, claimed_crc32c)
            recorded = self.db.call(
                fn.record_artifact_chunk, credential_hash, artifact_id, file_index, chunk_index, body.length,
                sha if claimed_crc32c is None else None, crc if claimed_crc32c is not None else None,
            )[0]  # fmt: skip
            if writer is not None:
                writer.commit()
        finally:
            if writer is not None:
                writer.close()
        if recorded["file_verified"]:
            state = self._file_state(credential_hash, artifact_id, file_index)["state"]
            return {"file_verified": True, "state": state}
        if recorded["all_chunks"]:
            artifact = self._assemble(credential_hash, target)
            return {"file_verified": True, "state": artifact["state"]}
        return {"file_verified": False, "state": "uploading"}

    def _staging_root(self, artifact_id: int) -> Path:
        return self.blob_dir / "staging" / "artifacts" / str(artifact_id)

    def _drop_staging(self, artifact_id: int) -> None:
        """The artifact's staged files and in-order hashes are no longer needed (complete, failed)."""
        STAGED_HASHES.forget_under(self._staging_root(artifact_id))
        shutil.rmtree(self._staging_root(artifact_id), ignore_errors=True)

    def _staging_file(self, target: dict) -> Path:
        return (
            self._staging_root(target["artifact_id"])
            / target["manifest_digest"][:16]
            / f"{target['file_index']}.part"
        )

    def _assemble(self, credential_hash: str, target: dict) -> dict:
        """Complete the file's sha256 (reading back, chunk by chunk, what was not hashed on arrival, each
        chunk checked against its recorded digest) and record the file verified only if it matches the
        manifest. Bad chunks (lost or damaged on the server) are dropped so the uploader resends them."""
        staged = self._staging_file(target)
        # Two last chunks arriving together both see "all chunks": one assembles, the other waits and
        # then finds the file verified (a lock file beside the staged file works across server processes).
        lock_path = staged.with_suffix(".lock")
        lock_path.parent.mkdir(parents=True, exist_ok=True)
        with open(lock_path, "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if self._file_state(credential_hash, target["artifact_id"], target["file_index"])["verified"]:
                return self.db.call(fn.finish_artifact, credential_hash, target["artifact_id"])[0]
            return self._assemble_locked(credential_hash, target, staged)

    def _file_state(self, credential_hash: str, artifact_id: int, file_index: int) -> dict:
        # One file's answer, not artifact_upload_status: asked once per file, which for an artifact of
        # tens of thousands of files made every file cost as much as all of them.
        return self.db.call(fn.artifact_file_state, credential_hash, artifact_id, file_index)[0]

    def _assemble_locked(self, credential_hash: str, target: dict, staged: Path) -> dict:
        # One pass over the staged bytes not hashed on arrival: each chunk is checked against the digest it
        # arrived with (crc32c costs a fraction of the sha256 this pass computes anyway) while the whole
        # file's sha256 — the proof against the manifest — is completed over the same bytes.
        chunks = self.db.call(
            fn.artifact_file_chunks, credential_hash, target["artifact_id"], target["file_index"]
        )
        chunk_size = int(target["chunk_size"])
        bad: list[int] = []
        state = STAGED_HASHES.take(staged)
        try:
            fd = os.open(staged, os.O_RDONLY)
        except FileNotFoundError:
            bad = [c["chunk_index"] for c in chunks]
            digest, size, proven = hashlib.sha256(), 0, 0
        else:
            try:
                # The prefix this process hashed as it arrived in order is proven already; the rest (all
                # of it after a restart, a resume elsewhere, or a change by someone else) is read here.
                digest, proven = trusted_prefix(state, fd)
                size = proven
                for chunk in chunks:
                    if chunk["chunk_index"] * chunk_size < proven:
                        continue
                    data = os.pread(fd, chunk["size"], chunk["chunk_index"] * chunk_size)
                    if len(data) != chunk["size"] or not chunk_matches(data, chunk):
                        bad.append(chunk["chunk_index"])
                        continue
                    digest.update(data)
                    size += len(data)
                os.fsync(fd)
            finally:
                os.close(fd)
            log.debug("%s: assembled, %d bytes hashed on arrival, %d read back", target["path"], proven,
                      size - proven)  # fmt: skip
        if bad:
            self.db.call(
                fn.discard_artifact_chunks,
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
                fn.discard_artifact_chunks,
                credential_hash,
                target["artifact_id"],
                target["file_index"],
                None,
                reason,
            )
            raise Refusal(reason, 409, "file")
        with gc_lock(self.blob_dir, exclusive=False):
            self.blobs.adopt_hashed(staged, target["sha256"])
            artifact = self.db.call(
                fn.record_artifact_file,
                credential_hash,
                target["artifact_id"],
                target["file_index"],
                target["sha256"],
                target["size"],
            )[0]
        if artifact["state"] == "complete":
            self._drop_staging(target["artifact_id"])
        return artifact

    def finish(self, credential_hash: str, artifact_id: int) -> dict:
        artifact = self.db.call(fn.finish_artifact, credential_hash, artifact_id)[0]
        if artifact["state"] == "uploading":
            # Files whose blobs arrived but whose record was lost (a crash between the two) verify here.
            artifact = self._verify_known_files(credential_hash, artifact)
        if artifact["state"] == "uploading":
            self._assemble_due(credential_hash, artifact_id)
            artifact = self.db.call(fn.finish_artifact, credential_hash, artifact_id)[0]
        return artifact

    def _assemble_due(self, credential_hash: str, artifact_id: int) -> None:
        """Assemble every file whose chunks are all recorded but which is not verified: its assembly after
        the last chunk was cut short (the server killed, its disk full or unwritable at that moment), and
        an uploader that holds nothing more to send would otherwise wait for it for ever. A file whose
        staged chunks turn out lost or wrong has them dropped (the uploader resends them)."""
        status = self.status(credential_hash, artifact_id)
        for entry in status["files"]:
            if not entry.get("all_chunks"):
                continue
            target = {
                "artifact_id": artifact_id, "manifest_digest": status["manifest_digest"],
                "chunk_size": status["chunk_size"], "file_index": entry["index"], "path": entry["path"],
                "size": entry["size"], "sha256": entry["sha256"],
            }  # fmt: skip
            try:
                self._assemble(credential_hash, target)
            except Refusal as refusal:
                log.info("artifact %s: %s", artifact_id, refusal.message)

    def refuse(self, credential_hash: str, refused: Refused) -> dict:
        """Record an output the agent cannot deliver as failed with its reason (refuse_artifact)."""
        artifact = self.db.call(
            fn.refuse_artifact, credential_hash, refused.member_id, refused.name, refused.kind, refused.reason
        )[0]
        self._drop_staging(artifact["id"])
        return artifact

    def fail(self, credential_hash: str, artifact_id: int, reason: str) -> dict:
        artifact = self.db.call(fn.fail_artifact, credential_hash, artifact_id, reason)[0]
        self._drop_staging(artifact_id)
        return artifact


@dataclass(frozen=True)
class ChunkBody:
    """A chunk's bytes as blocks (a request body read piece by piece) and its announced length."""

    length: int
    blocks: Iterable[bytes]

    @classmethod
    def of(cls, data: bytes) -> ChunkBody:
        return cls(len(data), (data,))


def _receive(
    body: ChunkBody, staged: Path | None, offset: int, want_sha256: bool
) -> tuple[str | None, int, StagedWriter | None]:
    """Write the chunk's blocks at `offset` of the staged file (None: only digest them) and return
    (sha256 if asked, crc32c) of exactly the bytes received, and the writer to commit once the chunk is
    recorded. A body shorter than announced is refused."""
    crc = 0
    sha = hashlib.sha256() if want_sha256 else None
    received = 0
    fd = writer = None
    if staged is not None:
        staged.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(staged, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        if fd is not None:
            writer = STAGED_HASHES.writer(staged, fd, offset)
        for block in body.blocks:
            if received + len(block) > body.length:
                raise Refusal(f"the chunk body is longer than its Content-Length {body.length}", 400, "chunk")
            crc = google_crc32c.extend(crc, block)
            if sha is not None:
                sha.update(block)
            if writer is not None:
                writer.write(fd, block)
            received += len(block)
    except BaseException:
        if writer is not None:
            writer.close()
        raise
    finally:
        if fd is not None:
            os.close(fd)
    if received != body.length:
        if writer is not None:
            writer.close()
        raise Refusal(f"the chunk body ended after {received} of {body.length} bytes", 400, "chunk")
    return (sha.hexdigest() if sha is not None else None), crc, writer


def check_chunk_digest(
    path: str, chunk_index: int, sha: str | None, crc: int, claimed_sha256: str | None,
    claimed_crc32c: str | None,
) -> None:  # fmt: skip
    """Refuse (422, naming the chunk) a chunk whose received bytes do not match the digest its uploader
    sent: crc32c as 8 hex digits (preferred), else sha256."""
    if claimed_crc32c is not None:
        try:
            claimed = int(claimed_crc32c, 16)
        except ValueError as exc:
            raise Refusal("X-Chunk-Crc32c must be the crc32c as 8 hex digits", 400, "chunk") from exc
        if crc != claimed:
            raise Refusal(
                f"{path}: chunk {chunk_index} has crc32c {crc:08x}, the uploader said {claimed_crc32c}; "
                "send it again",
                422,
                "chunk",
            )
        return
    assert claimed_sha256 is not None and sha is not None
    if sha != claimed_sha256.lower():
        raise Refusal(
            f"{path}: chunk {chunk_index} has sha256 {sha}, the uploader said {claimed_sha256}; "
            "send it again",
            422,
            "chunk",
        )


def chunk_matches(data: bytes, chunk: dict) -> bool:
    if chunk.get("crc32c") is not None:
        return google_crc32c.value(data) == chunk["crc32c"]
    return hashlib.sha256(data).hexdigest() == chunk["sha256"]


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
