"""Artifacts over HTTP: uploads from node agents, and listing, downloading and verifying for users.

Node agents authenticate with `Authorization: Node <node credential>`; every agent-side call passes the
credential's hash to a stored function that authenticates it and checks the node runs the member. Users
authenticate as everywhere else (API token or session); the stored functions show them their own jobs'
artifacts only (admins: all).
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Iterable
from pathlib import Path
from typing import BinaryIO

from flask import Blueprint, Response, current_app, request
from psycopg.types.json import Jsonb
from werkzeug.wsgi import wrap_file

from tuneplane.app import db_functions as fn
from tuneplane.app import humanize
from tuneplane.app.artifacts import s3_reads
from tuneplane.app.artifacts.blobs import FsBlobStore
from tuneplane.app.artifacts.reader import (
    S3Blobs,
    StoredBytesMismatch,
    open_stored,
    store_failure,
    stream_verified,
    verify_stored,
)
from tuneplane.app.artifacts.receiver import (
    MAX_CHUNK_BYTES,
    ArtifactReceiver,
    ChunkBody,
    fail_reason_from_json,
    refused_from_json,
    registration_from_json,
)
from tuneplane.app.artifacts.s3_delivery import FleetStores
from tuneplane.app.errors import Refusal
from tuneplane.app.security import token_hash
from tuneplane.app.web.auth import current_user, login_required
from tuneplane.app.web.limits import body_dict, query_int
from tuneplane.app.web.negotiate import json_response, respond
from tuneplane.app.web.state import get_db

bp = Blueprint("artifacts", __name__)

NODE_SCHEME = "Node "
STREAM_BLOCK = 1024 * 1024
# A download request carrying this header (value "sha256") verifies the bytes itself; see _send_file.
CLIENT_VERIFIES = "X-Client-Verifies"


def node_endpoint(view):
    """Agent endpoints authenticate with `Authorization: Node …`, which a browser never attaches on its
    own, so they need no CSRF token (app.web.csrf reads this attribute)."""
    view.csrf_exempt = True
    return view


def blob_dir() -> Path:
    configured = current_app.config.get("TP_BLOB_DIR")
    if configured:
        return Path(configured)
    data_dir = current_app.config.get("TP_DATA_DIR")
    if not data_dir:
        from tuneplane.app.settings import load_settings

        data_dir = load_settings().data_dir
    return Path(data_dir) / "blobs"


def receiver() -> ArtifactReceiver:
    return ArtifactReceiver(get_db(), blob_dir())


def node_credential_hash() -> str:
    header = request.headers.get("Authorization", "")
    if not header.startswith(NODE_SCHEME) or not header[len(NODE_SCHEME) :].strip():
        raise Refusal("node agents authenticate with `Authorization: Node <credential>`", 401, "credential")
    return token_hash(header[len(NODE_SCHEME) :].strip())


def public(artifact: dict) -> dict:
    keep = (
        "id", "job_id", "attempt_id", "member_id", "rank", "name", "kind", "state", "reason", "delivery",
        "shared_path", "manifest_digest", "file_count", "total_bytes", "chunk_size", "created_at",
        "updated_at", "completed_at",
    )  # fmt: skip
    return {k: artifact[k] for k in keep if k in artifact}


# -- node agents --------------------------------------------------------------------------------------


@bp.post("/api/artifacts")
@node_endpoint
def register():
    cred = node_credential_hash()
    reg = registration_from_json(request.get_json(silent=True))
    return json_response(public(receiver().register(cred, reg)), 201)


@bp.get("/api/artifacts/<int:artifact_id>/upload")
@node_endpoint
def upload_status(artifact_id: int):
    return json_response(receiver().status(node_credential_hash(), artifact_id))


@bp.put("/api/artifacts/<int:artifact_id>/files/<int:file_index>/chunks/<int:chunk_index>")
@node_endpoint
def put_chunk(artifact_id: int, file_index: int, chunk_index: int):
    cred = node_credential_hash()
    length = request.content_length
    if length is None or length > MAX_CHUNK_BYTES:
        raise Refusal("a chunk needs a Content-Length of at most 256 MiB", 411 if length is None else 413)
    # Streamed from the socket into the staged file block by block (no whole-chunk copy in memory).
    body = ChunkBody(length, iter(functools.partial(request.stream.read, STREAM_BLOCK), b""))
    answer = receiver().put_chunk(
        cred, artifact_id, file_index, chunk_index, body, request.headers.get("X-Chunk-Sha256"),
        request.headers.get("X-Chunk-Crc32c"),
    )  # fmt: skip
    return json_response(answer)


@bp.post("/api/artifacts/<int:artifact_id>/finish")
@node_endpoint
def finish(artifact_id: int):
    return json_response(public(receiver().finish(node_credential_hash(), artifact_id)))


@bp.post("/api/artifacts/<int:artifact_id>/fail")
@node_endpoint
def fail(artifact_id: int):
    reason = fail_reason_from_json(request.get_json(silent=True))
    return json_response(public(receiver().fail(node_credential_hash(), artifact_id, reason)))


@bp.post("/api/artifacts/refused")
@node_endpoint
def refused():
    cred = node_credential_hash()
    refused = refused_from_json(request.get_json(silent=True))
    return json_response(public(receiver().refuse(cred, refused)))


@bp.get("/api/input-artifacts/<int:artifact_id>")
@node_endpoint
def input_manifest(artifact_id: int):
    """A node reads a pinned input's manifest before materializing it."""
    artifact = get_db().call(fn.artifact_input_for_node, node_credential_hash(), artifact_id)[0]
    return json_response({**public(artifact), "manifest": artifact["manifest"]})


@bp.get("/api/input-artifacts/<int:artifact_id>/files/<int:file_index>")
@node_endpoint
def input_file(artifact_id: int, file_index: int):
    artifact = get_db().call(fn.artifact_input_for_node, node_credential_hash(), artifact_id)[0]
    entry = _entry(artifact, file_index)
    url = s3_reads.input_file_url(get_db(), FLEET_STORES, artifact, entry)
    if url is not None:  # an S3 fleet's file: the node GETs this one object from the store (s3_reads)
        return Response(status=307, headers={"Location": url, "X-Sha256": entry["sha256"]})
    return _send_file(artifact, entry)


@bp.post("/api/input-artifacts/<int:artifact_id>/files/<int:file_index>/mismatch")
@node_endpoint
def input_mismatch(artifact_id: int, file_index: int):
    """A node met store bytes that do not match (s3_reads.node_reported_mismatch: the server re-reads)."""
    cred = node_credential_hash()
    artifact = get_db().call(fn.artifact_input_for_node, cred, artifact_id)[0]
    entry = _entry(artifact, file_index)
    return json_response(s3_reads.node_reported_mismatch(get_db(), FLEET_STORES, cred, artifact, entry))


# -- users ----------------------------------------------------------------------------------------------


def _user_id() -> int:
    user = current_user()
    assert user is not None
    return user.id


def _files(artifact_id: int) -> list[dict]:
    return get_db().call(fn.artifact_file_list, artifact_id)


@bp.get("/jobs/<int:job_id>/artifacts")
@login_required
def job_artifacts(job_id: int):
    rows = get_db().call(fn.job_artifacts, _user_id(), job_id)
    # Newest attempt first; names in natural order (checkpoint.2 before checkpoint.10), as people count.
    rows.sort(key=lambda r: (-r["attempt"], humanize.natural_key(r["name"]), r["rank"]))
    return respond("_artifacts.html", {"job_id": job_id, "artifacts": rows}, json_data={"artifacts": rows})


@bp.get("/jobs/<int:job_id>/artifacts/<name>")
@login_required
def find(job_id: int, name: str):
    rank = query_int("rank", None, 0, 2**31 - 1)
    attempt = query_int("attempt", None, 1, 2**31 - 1)
    artifact = get_db().call(fn.find_artifact, _user_id(), job_id, name, rank, attempt)[0]
    return _detail(artifact)


@bp.get("/artifacts/<int:artifact_id>")
@login_required
def detail(artifact_id: int):
    return _detail(get_db().call(fn.artifact_for_user, _user_id(), artifact_id)[0])


def _detail(artifact: dict):
    files = _files(artifact["id"])
    data = {**public(artifact), "manifest": artifact["manifest"], "files": files}
    return respond("artifact.html", {"artifact": data, "files": files}, json_data=data)


@bp.get("/artifacts/<int:artifact_id>/files/<int:file_index>")
@login_required
def download_file(artifact_id: int, file_index: int):
    artifact = get_db().call(fn.artifact_for_user, _user_id(), artifact_id)[0]
    if artifact["state"] != "complete":
        raise Refusal(f"artifact {artifact_id} is {artifact['state']}; only complete artifacts download", 409)
    return _send_file(artifact, _entry(artifact, file_index))


def _entry(artifact: dict, file_index: int) -> dict:
    entry = next((f for f in _files(artifact["id"]) if f["file_index"] == file_index), None)
    if entry is None:
        raise Refusal(f"artifact {artifact['id']} has no file {file_index}", 404, "file_index")
    return entry


def _send_file(artifact: dict, entry: dict) -> Response:
    """The file streamed by this server: from its own store, the shared path, or (a user's download of an
    S3 fleet's artifact) from the fleet's store, never from this server's disk for those (ADR 0245)."""
    stream = open_stored(stored_blobs(get_db(), artifact["id"]), artifact, entry)
    if stream is None:
        raise Refusal(f"{entry['path']}: the stored file is missing (run verify)", 410, "file")
    if request.headers.get(CLIENT_VERIFIES) == "sha256":
        # The client hashes what it receives and keeps the file only if it matches the manifest (the CLI's
        # verified download): hashing here too would read every byte twice. The bytes go out as stored.
        body: Iterable[bytes] = wrap_file(request.environ, stream, STREAM_BLOCK)
    else:
        body = _checked_body(stream, entry, f"artifact {artifact['id']} {entry['path']}")
    response = Response(body, mimetype="application/octet-stream", direct_passthrough=True)
    response.headers["Content-Length"] = str(entry["size"])
    response.headers["X-Sha256"] = entry["sha256"]
    response.headers["X-Artifact-Path"] = entry["path"]
    return response


def _checked_body(stream: BinaryIO, entry: dict, label: str) -> Iterable[bytes]:
    """The stored bytes hashed on the way out (stream_verified). The first block is read here: a file that
    fits in it is fully checked before any header is sent, so a damaged one is a clear refusal; a larger
    one is cut mid-body (its last block is held back)."""
    body = stream_verified(stream, entry, label)
    try:
        first = [next(body)]
    except StopIteration:
        first = []
    except StoredBytesMismatch as exc:
        raise Refusal(
            f"{entry['path']}: the stored bytes do not match the manifest (run verify)", 409
        ) from exc
    return itertools.chain(first, body)


# The S3 stores of fleets, made once per location with this server's credentials (s3_delivery.FleetStores).
FLEET_STORES = FleetStores()


def stored_blobs(db, artifact_id: int, storage: dict | None = None) -> FsBlobStore | S3Blobs:
    """Where the artifact's bytes are read from: its fleet's S3 store (503 without the server's store
    credentials) or the server's own blob directory. `storage`: artifact_storage, when already read."""
    if storage is None:
        storage = _storage(db, artifact_id)
    if storage is None:
        return FsBlobStore(blob_dir())
    return S3Blobs.of_artifact(db, FLEET_STORES.store(storage), artifact_id)


def _storage(db, artifact_id: int) -> dict | None:
    """The artifact's fleet's S3 location (never a credential), or None for the server's own store."""
    return db.call(fn.artifact_storage, artifact_id)[0]["artifact_storage"]


def _verify_reading(blobs: FsBlobStore | S3Blobs, artifact: dict):
    """verify_stored; a store that fails mid-object (a cut or timed-out read) is a 503 with nothing
    recorded, as when it fails to open one (S3Blobs.open_file): an outage is no proof of corruption."""
    if not isinstance(blobs, S3Blobs):
        return verify_stored(blobs, artifact)
    from botocore.exceptions import BotoCoreError

    try:
        return verify_stored(blobs, artifact)
    except BotoCoreError as exc:
        raise store_failure(blobs.store, exc) from exc


@bp.post("/artifacts/<int:artifact_id>/verify")
@login_required
def verify(artifact_id: int):
    body_dict(())  # takes no fields: a JSON body naming one is refused by its name
    db = get_db()
    artifact = db.call(fn.artifact_to_verify, _user_id(), artifact_id)[0]
    storage = _storage(db, artifact_id)
    blobs = stored_blobs(db, artifact_id, storage)
    report = _verify_reading(blobs, artifact)
    db.call(
        fn.record_artifact_verification, _user_id(), artifact_id, report.ok, report.checked,
        Jsonb(report.problems()),
    )  # fmt: skip
    # `storage` says what was re-read (the CLI names it): the fleet's S3 location, or null for this server's.
    data = {"artifact_id": artifact_id, "name": artifact["name"], "storage": storage, **report.as_json()}
    return respond("_artifact_verify.html", {"report": data}, json_data=data)


@bp.post("/jobs/<int:job_id>/checkpoints")
@login_required
def request_checkpoint(job_id: int):
    """Ask the job's running members (or the one of `rank`) for a checkpoint now (202: asked; each
    member's workload saves one and publishes it as checkpoint.N, docs/artifacts.md)."""
    raw = body_dict(("rank",)).get("rank")
    rank = None
    if raw not in (None, ""):
        text = str(raw)
        if isinstance(raw, bool) or not isinstance(raw, int | str) or not (text.isascii() and text.isdigit()):
            raise Refusal("rank must be a member's rank number", 400, "rank")
        if int(text) > 2**31 - 1:
            raise Refusal("rank must be a member's rank number", 400, "rank")
        rank = int(text)
    asked = get_db().call(fn.request_checkpoint, _user_id(), job_id, rank)
    return json_response({"job_id": job_id, "asked": asked}, 202)
