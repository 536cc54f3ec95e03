"""The artifact endpoints for node agents on the node gateway (aiohttp), at the same paths as the
server's (app/web/artifacts.py), so an agent that only reaches the gateway delivers and fetches
artifacts there. The agent authenticates with its node credential (`Authorization: Bearer …` as for
every gateway call, or `Node …`); the stored functions check it.

Wiring (node gateway): `add_artifact_routes(app, database_url, blob_dir)` in Gateway.make_app, with
blob_dir the same blob store the server reads (Settings.blob_dir; `tuneplane up` shares one data dir).
The file work is blocking and runs in threads (asyncio.to_thread) on a small synchronous pool; a chunk
upload runs in its own pool's thread, fed the body as it arrives (BodyPipe).
"""

from __future__ import annotations

import asyncio
import queue
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from aiohttp import web

from tuneplane.app import db_functions as fn
from tuneplane.app.artifacts import s3_reads
from tuneplane.app.artifacts.blobs import FsBlobStore
from tuneplane.app.artifacts.reader import StoredBytesMismatch, open_stored, stream_verified
from tuneplane.app.artifacts.receiver import (
    MAX_CHUNK_BYTES,
    ArtifactReceiver,
    ChunkBody,
    fail_reason_from_json,
    refused_from_json,
    registration_from_json,
)
from tuneplane.app.artifacts.s3_delivery import FleetStores
from tuneplane.app.db import Database
from tuneplane.app.errors import Refusal
from tuneplane.app.security import token_hash

RECEIVER_KEY = web.AppKey("artifact_receiver", ArtifactReceiver)
STORES_KEY = web.AppKey("artifact_fleet_stores", FleetStores)
CHUNK_POOL_KEY = web.AppKey("artifact_chunk_pool", ThreadPoolExecutor)
# A chunk's thread holds on while its body arrives, so chunks get their own pool (other file work keeps
# asyncio.to_thread's). Bodies go to that thread in batches of about PIPE_BATCH bytes, PIPE_DEPTH ahead.
CHUNK_THREADS = 16
PIPE_BATCH = 4 * 1024 * 1024
PIPE_DEPTH = 2
# A body that sends nothing for this long is treated as cut short (its thread must not wait forever).
BODY_STALL_SECONDS = 300.0


def credential_hash(request: web.Request) -> str:
    header = request.headers.get("Authorization", "")
    for scheme in ("Bearer ", "Node "):
        if header.startswith(scheme) and header[len(scheme) :].strip():
            return token_hash(header[len(scheme) :].strip())
    raise Refusal("node agents authenticate with their node credential", 401, "credential")


def _error(refusal: Refusal) -> web.Response:
    return web.json_response(refusal.as_json(), status=refusal.status)


def _public(artifact: dict) -> dict:
    from tuneplane.app.web.negotiate import _default

    keep = ("id", "job_id", "attempt_id", "member_id", "rank", "name", "kind", "state", "reason", "delivery",
            "shared_path", "manifest_digest", "file_count", "total_bytes", "chunk_size")  # fmt: skip
    return {k: (_default(v) if hasattr(v, "isoformat") else v) for k, v in artifact.items() if k in keep}


def _handler(fn: Any) -> Any:
    async def wrapped(request: web.Request) -> web.StreamResponse:
        try:
            return await fn(request, request.app[RECEIVER_KEY], credential_hash(request))
        except Refusal as refusal:
            return _error(refusal)

    return wrapped


async def _json(request: web.Request) -> object:
    try:
        return await request.json()
    except ValueError as exc:
        raise Refusal("the request body must be a JSON object", 400, "body") from exc


async def _register(request: web.Request, rx: ArtifactReceiver, cred: str) -> web.StreamResponse:
    reg = registration_from_json(await _json(request))
    row = await asyncio.to_thread(rx.register, cred, reg)
    return web.json_response(_public(row), status=201)


async def _status(request: web.Request, rx: ArtifactReceiver, cred: str) -> web.StreamResponse:
    return web.json_response(await asyncio.to_thread(rx.status, cred, int(request.match_info["artifact_id"])))


async def _put_chunk(request: web.Request, rx: ArtifactReceiver, cred: str) -> web.StreamResponse:
    # Read the body from the stream: the gateway's client_max_size (sized for control messages) must not
    # bound a chunk; the chunk's own limit is the stored chunk size, checked by artifact_upload_target.
    length = request.content_length
    if length is None or length > MAX_CHUNK_BYTES:
        raise Refusal(f"a chunk needs a Content-Length of at most {MAX_CHUNK_BYTES} bytes",
                      411 if length is None else 413, "chunk")  # fmt: skip
    info = request.match_info
    pipe = BodyPipe(request.content, asyncio.get_running_loop())
    feeding = asyncio.create_task(pipe.feed())
    try:
        answer = await asyncio.get_running_loop().run_in_executor(
            request.app[CHUNK_POOL_KEY], rx.put_chunk, cred, int(info["artifact_id"]),
            int(info["file_index"]), int(info["chunk_index"]), ChunkBody(length, pipe.blocks()),
            request.headers.get("X-Chunk-Sha256"), request.headers.get("X-Chunk-Crc32c"),
        )  # fmt: skip
    finally:
        feeding.cancel()
    return web.json_response(answer)


class BodyPipe:
    """A chunk body read on the event loop and consumed, as it arrives, by the thread that checks, hashes
    and writes it: the network, the hashing and the disk overlap, blocks go to the thread as aiohttp read
    them (no joining copy of the whole chunk), and at most PIPE_DEPTH batches wait in memory (aiohttp
    stops reading the socket meanwhile)."""

    def __init__(self, content: Any, loop: asyncio.AbstractEventLoop) -> None:
        self.content = content
        self.loop = loop
        self.batches: queue.SimpleQueue[list[bytes] | None] = queue.SimpleQueue()
        self.room = asyncio.Semaphore(PIPE_DEPTH)

    async def feed(self) -> None:
        self.content.set_read_chunk_size(PIPE_BATCH)
        try:
            while not self.content.at_eof():
                await self.room.acquire()
                batch: list[bytes] = []
                size = 0
                # readchunk hands over aiohttp's buffered blocks one by one (readany would join them).
                while size < PIPE_BATCH and (block := (await self.content.readchunk())[0]):
                    batch.append(block)
                    size += len(block)
                if not batch:
                    break
                self.batches.put(batch)
        except Exception:  # a body cut short (the client went away): the receiver refuses it by its length
            pass
        finally:
            self.batches.put(None)

    def blocks(self) -> Iterator[bytes]:
        while True:
            try:
                batch = self.batches.get(timeout=BODY_STALL_SECONDS)
            except queue.Empty:
                return  # the client stopped sending: the receiver refuses the short body; the thread is free
            if batch is None:
                return
            yield from batch
            self.loop.call_soon_threadsafe(self.room.release)


async def _finish(request: web.Request, rx: ArtifactReceiver, cred: str) -> web.StreamResponse:
    row = await asyncio.to_thread(rx.finish, cred, int(request.match_info["artifact_id"]))
    return web.json_response(_public(row))


async def _fail(request: web.Request, rx: ArtifactReceiver, cred: str) -> web.StreamResponse:
    reason = fail_reason_from_json(await _json(request))
    row = await asyncio.to_thread(rx.fail, cred, int(request.match_info["artifact_id"]), reason)
    return web.json_response(_public(row))


async def _refused(request: web.Request, rx: ArtifactReceiver, cred: str) -> web.StreamResponse:
    refused = refused_from_json(await _json(request))
    return web.json_response(_public(await asyncio.to_thread(rx.refuse, cred, refused)))


async def _input_manifest(request: web.Request, rx: ArtifactReceiver, cred: str) -> web.StreamResponse:
    rows = await asyncio.to_thread(
        rx.db.call, fn.artifact_input_for_node, cred, int(request.match_info["artifact_id"])
    )
    return web.json_response({**_public(rows[0]), "manifest": rows[0]["manifest"]})


async def _input_entry(request: web.Request, rx: ArtifactReceiver, cred: str) -> tuple[dict, dict]:
    """(artifact, file row) of a pinned input the node's member is entitled to (artifact_input_for_node)."""
    artifact_id = int(request.match_info["artifact_id"])
    index = int(request.match_info["file_index"])
    artifact = (await asyncio.to_thread(rx.db.call, fn.artifact_input_for_node, cred, artifact_id))[0]
    files = await asyncio.to_thread(rx.db.call, fn.artifact_file_list, artifact_id)
    entry = next((f for f in files if f["file_index"] == index), None)
    if entry is None:
        raise Refusal(f"artifact {artifact_id} has no file {index}", 404, "file_index")
    return artifact, entry


async def _input_file(request: web.Request, rx: ArtifactReceiver, cred: str) -> web.StreamResponse:
    artifact, entry = await _input_entry(request, rx, cred)
    artifact_id = artifact["id"]
    url = await asyncio.to_thread(s3_reads.input_file_url, rx.db, request.app[STORES_KEY], artifact, entry)
    if url is not None:
        # An S3 fleet's file: the node fetches it from the store itself (a GET of this object only, for
        # minutes) and checks it against the manifest; no byte passes through this process.
        return web.Response(status=307, headers={"Location": url, "X-Sha256": entry["sha256"]})
    stream = open_stored(FsBlobStore(rx.blob_dir), artifact, entry)
    if stream is None:
        raise Refusal(f"{entry['path']}: the stored file is missing", 410, "file")
    blocks = stream_verified(stream, entry, f"artifact {artifact_id} {entry['path']}")
    try:
        first = await asyncio.to_thread(next, blocks, None)
    except StoredBytesMismatch as exc:
        await _found_corrupt(rx, artifact_id, entry)
        raise Refusal(f"{entry['path']}: the stored bytes do not match the manifest", 409) from exc
    response = web.StreamResponse(headers={"Content-Length": str(entry["size"]), "X-Sha256": entry["sha256"]})
    await response.prepare(request)
    try:
        while first is not None:
            await response.write(first)
            # A mismatch found at the end raises here and cuts the body short of Content-Length.
            first = await asyncio.to_thread(next, blocks, None)
    except StoredBytesMismatch:
        await _found_corrupt(rx, artifact_id, entry)
        raise
    await response.write_eof()
    return response


async def _found_corrupt(rx: ArtifactReceiver, artifact_id: int, entry: dict) -> None:
    """The server's own hash of the stored bytes disagrees with the manifest: the artifact is marked corrupt
    (its job's timeline says so; a checkpoint is never resumed from again, issue 35)."""
    await asyncio.to_thread(
        rx.db.call, fn.mark_artifact_corrupt, artifact_id,
        f"{entry['path']}: the stored bytes do not match the manifest",
        "the node gateway serving it to a node",
    )  # fmt: skip


async def _input_mismatch(request: web.Request, rx: ArtifactReceiver, cred: str) -> web.StreamResponse:
    """A node says the store's bytes of this file do not match the manifest (s3_reads.node_reported_mismatch:
    its word marks nothing, the server's own re-read does)."""
    artifact, entry = await _input_entry(request, rx, cred)
    stores = request.app[STORES_KEY]
    report = await asyncio.to_thread(s3_reads.node_reported_mismatch, rx.db, stores, cred, artifact, entry)
    return web.json_response(report)


async def _s3_step(request: web.Request, rx: ArtifactReceiver, credential: str) -> web.Response:
    """Direct delivery to the fleet's S3 store (app/artifacts/s3_delivery.py): begin, presign, complete."""
    artifact_id, file_index = int(request.match_info["artifact_id"]), int(request.match_info["file_index"])
    step = request.match_info["step"]
    body = await _json(request) if step != "begin" or request.can_read_body else {}
    if not isinstance(body, dict):
        raise Refusal("the body must be a JSON object", 400, "body")
    upload_id = body.get("upload_id")
    if step != "begin" and not (isinstance(upload_id, str) and 0 < len(upload_id) <= 1024):
        raise Refusal("upload_id: the upload's id from begin", 400, "upload_id")

    def run() -> object:
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            return steps()
        except (BotoCoreError, ClientError) as exc:  # the store is down or refused: the agent tries again
            raise Refusal(f"the object store failed: {exc}", 503, "storage") from exc

    def steps() -> object:
        delivery = request.app[STORES_KEY].delivery(rx.db, credential, artifact_id)
        if step == "begin":
            fresh = body.get("fresh", False)
            if not isinstance(fresh, bool):
                raise Refusal("fresh: true or false", 400, "fresh")
            return delivery.begin(credential, artifact_id, file_index, fresh=fresh)
        if step == "presign":
            parts = body.get("parts")
            if not isinstance(parts, list) or not all(isinstance(p, dict) for p in parts):
                raise Refusal("parts: a list of {part_number, crc32c}", 400, "parts")
            return {"parts": delivery.presign(credential, artifact_id, file_index, upload_id, parts)}
        return _public(delivery.complete(credential, artifact_id, file_index, upload_id))

    return web.json_response(await asyncio.to_thread(run))


def add_artifact_routes(
    app: web.Application, database_url: str, blob_dir: Path | str, *, pool_max: int = 4
) -> None:
    db = Database(database_url, max_size=pool_max, name="tuneplane-gateway-artifacts")
    app[RECEIVER_KEY] = ArtifactReceiver(db, blob_dir)
    app[STORES_KEY] = FleetStores()
    app[CHUNK_POOL_KEY] = ThreadPoolExecutor(CHUNK_THREADS, thread_name_prefix="artifact-chunk")

    async def close(_app: web.Application) -> None:
        app[CHUNK_POOL_KEY].shutdown(wait=False, cancel_futures=True)
        db.close()

    app.on_cleanup.append(close)
    r = app.router
    # Ids past bigint (indexes past integer) do not match: a 404, not a database error answered with 500.
    art, idx = "{artifact_id:[0-9]{1,18}}", "{file_index:[0-9]{1,9}}"
    r.add_post("/api/artifacts", _handler(_register))
    r.add_get(f"/api/artifacts/{art}/upload", _handler(_status))
    r.add_put(f"/api/artifacts/{art}/files/{idx}/chunks/{{chunk_index:[0-9]{{1,9}}}}", _handler(_put_chunk))
    r.add_post(f"/api/artifacts/{art}/finish", _handler(_finish))
    r.add_post(f"/api/artifacts/{art}/files/{idx}/s3/{{step:begin|presign|complete}}", _handler(_s3_step))
    r.add_post(f"/api/artifacts/{art}/fail", _handler(_fail))
    r.add_post("/api/artifacts/refused", _handler(_refused))
    r.add_get(f"/api/input-artifacts/{art}", _handler(_input_manifest))
    r.add_get(f"/api/input-artifacts/{art}/files/{idx}", _handler(_input_file))
    r.add_post(f"/api/input-artifacts/{art}/files/{idx}/mismatch", _handler(_input_mismatch))
