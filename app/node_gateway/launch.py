"""What the node gateway does for launches: the agents' launch report kinds, and the `capsule` file.

Report kinds (each one stored function, fenced by the session epoch, idempotent):
  probe            report_node_probe              the agent's peer-network probe port
  member_prepared  member_prepared                PREPARE succeeded (with the peer/storage checks)
  member_prepare_failed  member_prepare_failed    PREPARE failed: ABORT with the node's reason
  member_started   member_started                 the runner runs (pid)
  member_exited    member_exited                  the member ended (exit code, reason)
  reconcile        reconcile_node                 after (re)connecting: what runs, what ended meanwhile
  telemetry_token  issue_member_telemetry_token   the hash of a token the agent made for a member
  member_prepare_progress  member_prepare_progress  a PREPARE step (environment build) as a job event
  node_caches      report_node_caches             sizes of the node's environment and capsule caches

GET /v1/files/capsule/<sha256>: the capsule blob, only to a node that holds a member using it; a capsule of
an S3 fleet is answered with a redirect (307) to a presigned GET of its object in the fleet's store.
"""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

from aiohttp import web

from tuneplane.app import db_functions as fn
from tuneplane.app.artifacts.gateway_routes import STORES_KEY
from tuneplane.app.artifacts.s3_reads import DOWNLOAD_URL_TTL
from tuneplane.app.blobstore import FilesystemBlobStore
from tuneplane.app.errors import Refusal
from tuneplane.app.node_gateway.aiodb import AsyncDatabase
from tuneplane.app.node_gateway.files import register_file_provider
from tuneplane.app.node_gateway.reports import register_report

LAUNCH_REPORTS = {
    "probe": fn.report_node_probe,
    "member_prepared": fn.member_prepared,
    "member_prepare_failed": fn.member_prepare_failed,
    "member_started": fn.member_started,
    "member_exited": fn.member_exited,
    "reconcile": fn.reconcile_node,
    "telemetry_token": fn.issue_member_telemetry_token,
    "member_prepare_progress": fn.member_prepare_progress,
    "node_caches": fn.report_node_caches,
}
for _kind, _function in LAUNCH_REPORTS.items():
    register_report(_kind, _function)

DB_KEY = web.AppKey("launch_db", AsyncDatabase)
BLOBS_KEY = web.AppKey("launch_blobs", FilesystemBlobStore)
_SHA256 = re.compile(r"^[0-9a-f]{64}$")


def _refuse(refusal: Refusal) -> web.Response:
    return web.json_response(refusal.as_json(), status=refusal.status)


async def capsule_provider(request: web.Request, node: dict, name: str) -> web.StreamResponse:
    db = request.app.get(DB_KEY)
    blobs = request.app.get(BLOBS_KEY)
    if db is None or blobs is None:
        return _refuse(Refusal("this gateway has no blob store configured (--data-dir)", status=404))
    if not _SHA256.match(name):
        return _refuse(
            Refusal("a capsule is named by its sha256 (64 hex digits)", status=404, field="capsule")
        )
    allowed = (await db.call_one(fn.node_may_read_capsule, node["node_id"], name))["node_may_read_capsule"]
    if not allowed:
        return _refuse(
            Refusal(f"capsule {name} belongs to no member placed on this node", status=403, field="capsule")
        )
    path = blobs.path(name)
    if path.is_file():
        return web.FileResponse(path, headers={"Content-Type": "application/x-tar", "X-Capsule-Digest": name})
    storage = (await db.call_one(fn.node_capsule_storage, node["node_id"], name))["node_capsule_storage"]
    if storage is not None:
        # An S3 fleet's capsule (the worker wrote it there): the node GETs that one object from the store
        # with a URL signed for minutes, resuming with Range as from here, and checks the digest itself.
        try:
            store = await asyncio.to_thread(request.app[STORES_KEY].store, storage)
        except Refusal as refusal:
            return _refuse(refusal)
        url = store.presign_get(store.blob_key(name), DOWNLOAD_URL_TTL)
        return web.Response(status=307, headers={"Location": url, "X-Capsule-Digest": name})
    return _refuse(Refusal(f"capsule {name} is not in the blob store", status=404, field="capsule"))


register_file_provider("capsule", capsule_provider)


def install(app: web.Application, db: AsyncDatabase, blob_dir: Path | None) -> None:
    """Give the capsule provider its database and blob store; wire the artifact routes (issue 7)."""
    app[DB_KEY] = db
    if blob_dir is None:
        return
    from tuneplane.app.artifacts.gateway_routes import add_artifact_routes

    app[BLOBS_KEY] = FilesystemBlobStore(Path(blob_dir))
    add_artifact_routes(app, db.url, blob_dir)
