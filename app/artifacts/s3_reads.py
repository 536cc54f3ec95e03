"""Reading an S3 fleet's artifact files (issue 32, downloads; docs/artifacts.md "Object storage").

A node fetches a pinned input or the checkpoint it resumes from with a presigned GET straight from the store:
the node gateway (or the console server) answers the file request it always answered with a redirect to a
URL signed for exactly that file's object, GET only, for `DOWNLOAD_URL_TTL` seconds, after the stored
function `artifact_input_for_node` said the node's member is entitled to it (the same check the server's own
store is read under). The node hashes what it receives against the manifest before the member may use it.

The store does not vouch for bytes at rest, and a node is not trusted to say an artifact is corrupt: when a
node reports that the store's bytes did not match, the server re-reads the object itself (`recheck_object`,
off the node) and only its own hash marks the artifact corrupt (`mark_artifact_corrupt`, issue 35: a
checkpoint so marked is never resumed from again).
"""

from __future__ import annotations

from typing import Any

from tuneplane.app import db_functions as fn
from tuneplane.app.artifacts.s3_delivery import FleetStores
from tuneplane.app.db import Database
from tuneplane.app.errors import Refusal
from tuneplane.app.s3store import S3Store

# A presigned GET is checked when the request starts; a long transfer begun in time runs to its end.
DOWNLOAD_URL_TTL = 300


def object_key(store: S3Store, entry: dict[str, Any]) -> str:
    """The object key of one verified artifact file (an `artifact_file_list` row): its `object_key`, which
    tuneplane.artifact_object_key answers (where the upload verified it, or another artifact's object it
    reuses), under the store's prefix."""
    return store.key(entry["object_key"])


def fleet_store(db: Database, stores: FleetStores, artifact: dict[str, Any]) -> S3Store | None:
    """The S3 store holding the artifact's bytes, or None when they are the server's to read (its own
    store, or the fleet's shared path for a `shared` artifact)."""
    if artifact["delivery"] == "shared":
        return None
    storage = db.call(fn.artifact_storage, artifact["id"])[0]["artifact_storage"]
    return None if storage is None else stores.store(storage)


def input_file_url(
    db: Database, stores: FleetStores, artifact: dict[str, Any], entry: dict[str, Any]
) -> str | None:
    """Where a node fetches one file of an input it is entitled to (the caller asked
    artifact_input_for_node): a GET of exactly that file's object for DOWNLOAD_URL_TTL seconds, or None
    when the server serves it from its own store."""
    store = fleet_store(db, stores, artifact)
    return None if store is None else store.presign_get(object_key(store, entry), DOWNLOAD_URL_TTL)


def node_reported_mismatch(
    db: Database, stores: FleetStores, credential_hash: str, artifact: dict[str, Any], entry: dict[str, Any]
) -> dict[str, Any]:
    """A node entitled to the input says the store's bytes of this file do not match the manifest: the
    server re-reads the object (`recheck_object`) and answers whether it found it corrupt."""
    store = fleet_store(db, stores, artifact)
    if store is None:
        raise Refusal("this artifact is not read from an object store", 409, "storage")
    node = db.call(fn.authenticate_node_credential, credential_hash)[0]
    found_by = f"the server re-reading the store after node {node['fleet']}/{node['node']} met a mismatch"
    corrupt = recheck_object(db, store, artifact["id"], entry, found_by)
    return {"artifact_id": artifact["id"], "file_index": entry["file_index"], "corrupt": corrupt}


def recheck_object(
    db: Database, store: S3Store, artifact_id: int, entry: dict[str, Any], found_by: str
) -> bool:
    """Re-hash the file's object in the store here (a node said its bytes did not match); a mismatch or a
    missing object marks the artifact corrupt. True when it is corrupt. A store that fails to answer proves
    nothing: 503, nothing marked (a store outage must not condemn a good checkpoint)."""
    from botocore.exceptions import BotoCoreError, ClientError

    try:
        sha256, size = store.object_sha256(object_key(store, entry))
    except ClientError as exc:
        if exc.response.get("Error", {}).get("Code") not in ("404", "NoSuchKey", "NotFound"):
            raise Refusal(f"the object store failed: {exc}", 503, "storage") from exc
        sha256, size = "", -1
    except BotoCoreError as exc:
        raise Refusal(f"the object store failed: {exc}", 503, "storage") from exc
    if sha256 == entry["sha256"] and size == int(entry["size"]):
        return False
    db.call(
        fn.mark_artifact_corrupt, artifact_id,
        f"{entry['path']}: the stored object does not match the manifest", found_by,
    )  # fmt: skip
    return True
