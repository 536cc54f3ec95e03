"""Chunked, resumable uploads of an artifact's files (object delivery), client side.

Every file is cut into fixed-size chunks (the size the server chose when the artifact was registered, so
a resumed upload cuts the same way). Each chunk travels with its crc32c (X-Chunk-Crc32c); the server
refuses a chunk whose bytes do not match it. Before sending anything the client asks which chunks the
server already holds and which files it has already verified, so an interrupted upload (a killed agent, a
dropped connection) resumes where the server's durable state says it stopped. The server, not the client,
decides that a file and then the artifact are complete: it hashes each assembled file against the manifest.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import google_crc32c

from tuneplane.app.client.transport import retry_after
from tuneplane.workers.artifacts.manifest import Manifest

DEFAULT_CHUNK_SIZE = 32 * 1024 * 1024
SEND_PIECE = 1024 * 1024
# A small artifact's files travel inside its registration (`inline`, base64): one request instead of the
# registration, the status, a chunk per file and the finish (issue 23: a gang's ends all deliver at once).
INLINE_MAX_BYTES = 512 * 1024  # its base64 stays under the 1 MiB a JSON string may hold (app.input_limits)
INLINE_MAX_FILES = 64


# 4xx answers that are worth another try (the server was busy or timed the request out).
RETRYABLE_4XX = (408, 425, 429)


def retryable_status(status: int | None) -> bool:
    """Whether trying again later can succeed after this answer: none at all (unreachable), a server
    failure, or a 4xx that says busy or too slow; any other 4xx is a refusal that will not change."""
    return status is None or status >= 500 or status in RETRYABLE_4XX


class UploadError(RuntimeError):
    """The upload cannot go on; the message names the file or the server's reason. `status` is the HTTP
    status of a server refusal (None otherwise), so a caller can tell a retryable 5xx from a 4xx."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status

    @property
    def retryable(self) -> bool:
        """Whether trying again later can succeed: the server failed or was unreachable, not a refusal."""
        return retryable_status(self.status)


@dataclass(frozen=True)
class Chunk:
    index: int
    offset: int
    length: int


def chunk_plan(size: int, chunk_size: int) -> list[Chunk]:
    """The chunks of a file of `size` bytes; an empty file has none."""
    if chunk_size <= 0:
        raise ValueError("chunk size must be positive")
    return [Chunk(i, off, min(chunk_size, size - off)) for i, off in enumerate(range(0, size, chunk_size))]


def chunk_count(size: int, chunk_size: int) -> int:
    return (size + chunk_size - 1) // chunk_size


def read_chunk(path: Path, chunk: Chunk) -> tuple[list[bytes], str]:
    """The chunk's bytes, in pieces of SEND_PIECE, and their crc32c (8 hex digits). crc32c, not sha256:
    the server proves the whole file by its sha256 in one pass once every chunk is in; a chunk's own digest
    only has to catch damage in transit, and costing a fraction of sha256 it keeps the uploader at one hash
    pass per byte. Pieces, not one bytes object: a whole-chunk allocation maps and faults in fresh memory
    for every chunk, and httpcore copies what is left of a body piece after every partial socket send."""
    fd = os.open(path, os.O_RDONLY)
    pieces = []
    crc = got = 0
    try:
        for offset in range(chunk.offset, chunk.offset + chunk.length, SEND_PIECE):
            piece = os.pread(fd, min(SEND_PIECE, chunk.offset + chunk.length - offset), offset)
            crc = google_crc32c.extend(crc, piece)
            pieces.append(piece)
            got += len(piece)
    finally:
        os.close(fd)
    if got != chunk.length:
        raise UploadError(
            f"{path}: file is shorter than its manifest entry (changed after the manifest was built)"
        )
    return pieces, f"{crc:08x}"


class ChunkTransport(Protocol):
    """How an uploader talks to the server for one registered artifact."""

    def status(self) -> dict[str, Any]:
        """{"state", "chunk_size", "files": [{"index", "path", "size", "sha256", "verified", "chunks"}]}"""
        ...

    def put_chunk(
        self, file_index: int, chunk_index: int, data: bytes | list[bytes], crc32c: str
    ) -> dict[str, Any]:
        """Send one chunk: its bytes, or its pieces in order."""
        ...

    def finish(self) -> dict[str, Any]: ...


@dataclass
class UploadResult:
    state: str
    chunks_sent: int
    chunks_skipped: int
    bytes_sent: int
    files_already_verified: int
    reason: str | None = None


def pending_by_file(status: dict[str, Any], manifest: Manifest) -> list[tuple[dict, list[Chunk]]]:
    """(server file entry, its missing chunks in order) for every file the server has not verified."""
    chunk_size = int(status["chunk_size"])
    local = manifest.by_path()
    work = []
    for entry in status["files"]:
        mine = local.get(entry["path"])
        if mine is None or mine.sha256 != entry["sha256"] or mine.size != entry["size"]:
            raise UploadError(f"{entry['path']}: the server's manifest differs from the local one")
        if entry["verified"]:
            continue
        held = set(entry.get("chunks") or ())
        missing = [c for c in chunk_plan(mine.size, chunk_size) if c.index not in held]
        if missing:
            work.append((entry, missing))
    return work


def upload_artifact(
    root: Path | str,
    manifest: Manifest,
    transport: ChunkTransport,
    *,
    on_chunk: Callable[[str, int, int], None] | None = None,
    parallel: int = 4,
) -> UploadResult:
    """Send every chunk the server lacks, then ask it to finish; resumable by calling it again.

    `parallel` files go at a time, each file's chunks one after the other in order: the server hashes a
    file while its chunks arrive in order and then need not read it back (app/artifacts/staged_hash.py),
    and several files keep both CPUs and the link busy. The first failed chunk stops the upload (chunks
    already sent stay on the server)."""
    root_path = Path(root)
    status = transport.status()
    if status["state"] == "complete":
        return UploadResult("complete", 0, 0, 0, len(status["files"]))
    if status["state"] == "failed":
        raise UploadError(f"artifact upload failed: {status.get('reason') or 'no reason recorded'}")
    storage = status.get("storage")
    if storage and storage.get("kind") == "s3":
        return upload_direct(root_path, manifest, transport, status, parallel=parallel)
    already = sum(1 for f in status["files"] if f["verified"])
    total_chunks = sum(
        chunk_count(f["size"], int(status["chunk_size"])) for f in status["files"] if not f["verified"]
    )
    work = pending_by_file(status, manifest)
    stop = threading.Event()

    def send_file(item: tuple[dict, list[Chunk]]) -> tuple[int, int]:
        entry, chunks = item
        sent = sent_bytes = 0
        for chunk in chunks:
            if stop.is_set():
                break
            data, crc = read_chunk(root_path / entry["path"], chunk)
            transport.put_chunk(entry["index"], chunk.index, data, crc)
            if on_chunk is not None:
                on_chunk(entry["path"], chunk.index, chunk.length)
            sent, sent_bytes = sent + 1, sent_bytes + chunk.length
        return sent, sent_bytes

    sent = sent_bytes = 0
    with ThreadPoolExecutor(max_workers=max(1, parallel), thread_name_prefix="chunk-upload") as pool:
        futures = [pool.submit(send_file, item) for item in work]
        try:
            for future in as_completed(futures):
                n, nbytes = future.result()
                sent, sent_bytes = sent + n, sent_bytes + nbytes
        except BaseException:
            stop.set()
            for future in futures:
                future.cancel()
            raise
    final = transport.finish()
    return UploadResult(final["state"], sent, total_chunks - sent, sent_bytes, already, final.get("reason"))


def upload_direct(
    root: Path, manifest: Manifest, transport: Any, status: dict[str, Any], *, parallel: int = 4
) -> UploadResult:
    """A fleet with an S3 store (docs/artifacts.md "Object storage"): each unverified file goes in parts to
    presigned URLs straight to the store (workers/artifacts/s3_upload.py); the server completes it after
    verifying its sha256. Resumable: `begin` lists the parts the store already holds."""
    from tuneplane.workers.artifacts.s3_upload import (
        PartRefused,
        StoreUnreachable,
        holds_other_bytes,
        upload_parts,
    )

    local = manifest.by_path()
    already = sum(1 for f in status["files"] if f["verified"])
    todo = []
    for entry in status["files"]:
        mine = local.get(entry["path"])
        if mine is None or mine.sha256 != entry["sha256"] or mine.size != entry["size"]:
            raise UploadError(f"{entry['path']}: the server's manifest differs from the local one")
        if not entry["verified"]:
            todo.append(entry)

    def send_file(entry: dict[str, Any]) -> tuple[int, int]:
        plan = transport.s3_begin(entry["index"])
        if plan.get("verified"):
            return 0, 0
        if plan["parts"] and holds_other_bytes(root / entry["path"], plan):
            plan = transport.s3_begin(entry["index"], fresh=True)

        def presign(parts: list[dict], index: int = entry["index"], upload: str = plan["upload_id"]):
            return transport.s3_presign(index, upload, parts)

        try:
            sent = upload_parts(root / entry["path"], plan, presign, parallel=parallel)
        except PartRefused as exc:
            raise UploadError(str(exc)) from exc
        except StoreUnreachable as exc:
            # The store unreachable (down, restarting) after the part's own retries: like a server that
            # does not answer, the artifact stays uploading and the next try resumes from the parts held.
            raise UploadError(f"{entry['path']}: the store did not answer: {exc}") from exc
        # The server verifies this file (its own thread here) while this lane goes on to the next one.
        completions.append(verifying.submit(complete, entry["index"], plan["upload_id"]))
        return sent, int(entry["size"])

    def complete(index: int, upload_id: str) -> None:
        done = transport.s3_complete(index, upload_id)
        if done.get("state") == "failed":
            raise UploadError(f"artifact upload failed: {done.get('reason') or 'no reason recorded'}")

    sent = sent_bytes = 0
    completions: list[Future] = []
    # Two files at a time, `parallel` parts each (small files, one part each, do not go one after the
    # other), and each file's verification on the server in a thread of its own, so a lane goes on to
    # its next file meanwhile. Measured (bench/artifacts_s3.py, 2 shared CPUs): one lane or two parts
    # per file did no better.
    with (
        ThreadPoolExecutor(max_workers=2, thread_name_prefix="s3-upload") as lanes,
        ThreadPoolExecutor(max_workers=2, thread_name_prefix="s3-complete") as verifying,
    ):
        for n, nbytes in lanes.map(send_file, todo):
            sent, sent_bytes = sent + n, sent_bytes + nbytes
        for completion in completions:
            completion.result()
    final = transport.finish()
    return UploadResult(final["state"], sent, 0, sent_bytes, already, final.get("reason"))


class HttpChunkTransport:
    """ChunkTransport over the server's artifact upload endpoints (docs/http.md, Artifacts)."""

    def __init__(self, http: Any, artifact_id: int, *, retries: int = 4, backoff: float = 0.2) -> None:
        # `http` is an httpx.Client whose base URL is the server and whose headers carry the credential.
        self.http = http
        self.artifact_id = artifact_id
        self.retries = retries
        self.backoff = backoff

    def _request(self, method: str, path: str, **kwargs: Any) -> dict[str, Any]:
        import httpx

        last: Exception | None = None
        for attempt in range(self.retries + 1):
            asked = None
            try:
                response = self.http.request(method, path, **kwargs)
            except httpx.TransportError as exc:
                last = exc
            else:
                if response.status_code < 500:
                    body = _json_or_none(response)
                    if response.is_success:
                        return body or {}
                    message = (body or {}).get("error") or f"HTTP {response.status_code}"
                    raise UploadError(f"server refused {method} {path}: {message}", response.status_code)
                last = UploadError(f"server answered HTTP {response.status_code} to {method} {path}")
                # 503 + Retry-After: the server's database is away (a failover) and says when it is back.
                asked = retry_after(response.status_code, response.headers.get("Retry-After"))
            # Transient: the server restarting or the network dropping. Back off and ask again.
            time.sleep(max(self.backoff * (2**attempt), asked or 0.0))
        raise UploadError(f"{method} {path} failed after {self.retries + 1} tries: {last}")

    def status(self) -> dict[str, Any]:
        return self._request("GET", f"/api/artifacts/{self.artifact_id}/upload")

    def put_chunk(
        self, file_index: int, chunk_index: int, data: bytes | list[bytes], crc32c: str
    ) -> dict[str, Any]:
        pieces = [data] if isinstance(data, bytes) else data
        return self._request(
            "PUT",
            f"/api/artifacts/{self.artifact_id}/files/{file_index}/chunks/{chunk_index}",
            content=pieces,
            headers={
                "Content-Type": "application/octet-stream",
                "Content-Length": str(sum(len(p) for p in pieces)),
                "X-Chunk-Crc32c": crc32c,
            },
        )

    def finish(self) -> dict[str, Any]:
        return self._request("POST", f"/api/artifacts/{self.artifact_id}/finish")

    # Direct delivery to the fleet's S3 store (app/artifacts/s3_delivery.py, on the node gateway).
    def _s3(self, file_index: int, step: str, body: dict[str, Any]) -> dict[str, Any]:
        path = f"/api/artifacts/{self.artifact_id}/files/{file_index}/s3/{step}"
        return self._request("POST", path, json=body)

    def s3_begin(self, file_index: int, *, fresh: bool = False) -> dict[str, Any]:
        return self._s3(file_index, "begin", {"fresh": True} if fresh else {})

    def s3_presign(self, file_index: int, upload_id: str, parts: list[dict[str, Any]]) -> list[dict]:
        return self._s3(file_index, "presign", {"upload_id": upload_id, "parts": parts})["parts"]

    def s3_complete(self, file_index: int, upload_id: str) -> dict[str, Any]:
        return self._s3(file_index, "complete", {"upload_id": upload_id})


def _json_or_none(response: Any) -> dict | None:
    try:
        value = response.json()
    except ValueError:
        return None
    return value if isinstance(value, dict) else None
