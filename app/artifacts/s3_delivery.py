"""Direct delivery of an artifact's files to an S3 store (issue 32; docs/artifacts.md "Object storage").

The node never holds the store's keys. For each file of its artifact that is not verified yet it asks the
server to `begin` (the server opens, or finds again, a multipart upload at the file's own key
`artifacts/<artifact>/<file>`, and answers the part size and the parts the store already holds: a restarted
agent resends only the others), then for presigned part URLs (`presign`: each bound to that key, upload,
part number and the part's CRC32C, for minutes), PUTs the parts in parallel straight to the store, and
asks the server to `complete`. The server completes the upload with the parts the store lists, streams the
object once and checks its sha256 and size against the manifest (off the node: ADR 0245); only then does it
record the file verified where it lies (record_artifact_object: the key is kept with the file, read back
through artifact_object_key — no copy, no second write of any byte), which makes the artifact `complete`
once every file is. Bytes that do not match are deleted and fail the artifact (fail_artifact): it is never
complete. A file whose bytes another complete artifact in the same store already holds is not uploaded at
all: registration records it at that object (reuse_artifact_objects, the receiver). Every call names
the node's credential, so the stored functions refuse a node that did not produce the artifact before
any URL is signed.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import asdict
from typing import Any

from tuneplane.app import db_functions as fn
from tuneplane.app.db import Database
from tuneplane.app.errors import Refusal
from tuneplane.app.s3store import (
    MAX_PARTS,
    MIN_PART_SIZE,
    S3ConfigError,
    S3Credentials,
    S3Location,
    S3Store,
    load_credentials,
)

DEFAULT_PART_SIZE = 64 * 1024 * 1024
MAX_URLS_PER_CALL = 64


# Where the node's uploads go, under the store's prefix: an object per artifact file, verified in place.
OBJECTS = "artifacts/"


def upload_name(artifact_id: int, file_index: int) -> str:
    """The object a file's upload writes (its name under the store's prefix); once verified, recorded with
    the file (artifact_object_key answers for it from then on)."""
    return f"{OBJECTS}{artifact_id}/{file_index}"


def part_size_for(size: int, preferred: int = DEFAULT_PART_SIZE) -> int:
    """At least S3's 5 MiB minimum, and large enough that the file fits in 10,000 parts."""
    needed = -(-size // MAX_PARTS)
    return max(MIN_PART_SIZE, preferred, needed)


class S3Delivery:
    def __init__(
        self, db: Database, store: S3Store, *, url_ttl: int = 600, part_size: int = DEFAULT_PART_SIZE
    ):
        self.db = db
        self.store = store
        self.url_ttl = url_ttl
        self.part_size = part_size

    def upload_key(self, artifact_id: int, file_index: int) -> str:
        return self.store.key(upload_name(artifact_id, file_index))

    def _file(self, credential_hash: str, artifact_id: int, file_index: int) -> dict[str, Any]:
        """One file of the artifact ({state, verified, path, size, sha256}); refuses another node's artifact
        (the stored function) and an artifact that is not uploading (409)."""
        entry = self.db.call(fn.artifact_file_state, credential_hash, artifact_id, file_index)[0]
        if entry["state"] != "uploading":
            raise Refusal(f"artifact {artifact_id} is {entry['state']}, not uploading", 409, "state")
        return entry

    def _open_uploads(self, artifact_id: int, file_index: int) -> list[str]:
        key = self.upload_key(artifact_id, file_index)
        found = self.store.open_uploads(upload_name(artifact_id, file_index))
        return [u["UploadId"] for u in found if u["Key"] == key]

    def begin(
        self, credential_hash: str, artifact_id: int, file_index: int, *, fresh: bool = False
    ) -> dict[str, Any]:
        """The file's multipart upload (opened now or found again) and the parts the store already holds.
        `fresh`: abort the open one first (the node found it holds other bytes than its file's:
        workers/artifacts/s3_upload.holds_other_bytes) and open another."""
        entry = self._file(credential_hash, artifact_id, file_index)
        size = int(entry["size"])
        if entry["verified"]:
            return {"verified": True, "file_index": file_index}
        key = self.upload_key(artifact_id, file_index)
        open_ids = self._open_uploads(artifact_id, file_index)
        if fresh:
            for stale in open_ids:
                self.store.abort_multipart(key, stale)
            open_ids = []
        upload_id = open_ids[0] if open_ids else self.store.create_multipart(key)
        parts = self.store.list_parts(key, upload_id) if open_ids else []
        return {
            "verified": False,
            "file_index": file_index,
            "upload_id": upload_id,
            "part_size": part_size_for(size, self.part_size),
            "size": size,
            "parts": [{"part_number": p["PartNumber"], "size": p["Size"], "etag": p["ETag"]} for p in parts],
        }

    def presign(
        self, credential_hash: str, artifact_id: int, file_index: int, upload_id: str, parts: list[dict]
    ) -> list[dict[str, Any]]:
        """Part URLs, each signed over its CRC32C: `parts` is [{"part_number", "crc32c"}]."""
        self._file(credential_hash, artifact_id, file_index)
        if not parts or len(parts) > MAX_URLS_PER_CALL:
            raise Refusal(f"parts: 1 to {MAX_URLS_PER_CALL} per call", 400, "parts")
        key = self.upload_key(artifact_id, file_index)
        signed = []
        for part in parts:
            try:
                url = self.store.presign_part(
                    key, upload_id, int(part["part_number"]), str(part["crc32c"]), self.url_ttl
                )
            except (KeyError, TypeError, ValueError) as exc:
                raise Refusal(f"parts: {exc}", 400, "parts") from exc
            signed.append(asdict(url))
        return signed

    def complete(self, credential_hash: str, artifact_id: int, file_index: int, upload_id: str) -> dict:
        """Complete the upload, verify the object off the node, and record the file (or fail the artifact)."""
        entry = self._file(credential_hash, artifact_id, file_index)
        key = self.upload_key(artifact_id, file_index)
        if not entry["verified"]:
            self._complete_upload(key, upload_id, int(entry["size"]))
            sha256, size = self.store.object_sha256(key)
            if sha256 != entry["sha256"] or size != int(entry["size"]):
                self.store.delete(key)
                reason = (
                    f"{entry['path']}: the store holds {size} bytes with sha256 {sha256}, "
                    f"the manifest says {entry['size']} bytes with sha256 {entry['sha256']}"
                )
                return self.db.call(fn.fail_artifact, credential_hash, artifact_id, reason)[0]
        return self.db.call(
            fn.record_artifact_object,
            credential_hash,
            artifact_id,
            file_index,
            entry["sha256"],
            int(entry["size"]),
            upload_name(artifact_id, file_index),
        )[0]

    def _complete_upload(self, key: str, upload_id: str, size: int) -> None:
        """Complete only when the store holds parts 1..n covering the file: a missing part is the node's to
        send (409, the upload stays open for it), not a reason to assemble a short object. An upload the
        store no longer lists was completed before (a crash between completing and recording): the object
        at the key is what it made, verified next. An object left at the key by an earlier manifest of the
        artifact (failed, registered again) is replaced by the open upload, never verified in its place."""
        from botocore.exceptions import ClientError

        try:
            parts = self.store.list_parts(key, upload_id)
        except ClientError as exc:
            if self.store.object_size(key) is not None:
                return
            raise Refusal(f"upload_id: no open upload {upload_id} for this file", 409, "upload_id") from exc
        numbers = [p["PartNumber"] for p in parts]
        held = sum(int(p["Size"]) for p in parts)
        if numbers != list(range(1, len(parts) + 1)) or held != size:
            raise Refusal(f"the store holds parts {numbers} ({held} of {size} bytes)", 409, "parts")
        ambiguous = [p["PartNumber"] for p in parts if p["ETag"] is None]
        if ambiguous:
            raise Refusal(f"the store holds two different parts {ambiguous}: begin afresh", 409, "parts")
        self.store.complete_multipart(key, upload_id, parts)


class FleetStores:
    """The S3 store of each fleet's storage row, made once per location with the server's credentials
    (loaded on first use: a server without them refuses direct delivery with a 503 naming the variables)."""

    def __init__(self, credentials: Callable[[], S3Credentials] = load_credentials) -> None:
        self._credentials = credentials
        self._stores: dict[S3Location, S3Store] = {}
        self._lock = threading.Lock()

    def store(self, storage: dict) -> S3Store:
        location = S3Location(
            endpoint=storage.get("endpoint"),
            bucket=storage["bucket"],
            prefix=storage.get("prefix") or "",
            region=storage.get("region") or "us-east-1",
            addressing_style=storage.get("addressing_style") or "path",
        )
        with self._lock:
            if location not in self._stores:
                try:
                    credentials = self._credentials()
                except S3ConfigError as exc:
                    raise Refusal(f"the server has no store credentials: {exc}", 503, "storage") from exc
                self._stores[location] = S3Store(location, credentials)
            return self._stores[location]

    def delivery(self, db: Database, credential_hash: str, artifact_id: int) -> S3Delivery:
        """Direct delivery for one artifact of a fleet with an S3 store (409 for the server's own store)."""
        storage = db.call(fn.artifact_storage_for_node, credential_hash, artifact_id)[0][
            "artifact_storage_for_node"
        ]
        if not storage or storage.get("kind") != "s3":
            raise Refusal("this artifact's fleet uses the server's store: upload chunks", 409, "storage")
        return S3Delivery(db, self.store(storage))


def abort_stale_uploads(db: Database, store: S3Store, *, min_age: float = 3600.0) -> list[str]:
    """Abort the multipart uploads (and delete the unrecorded objects) of artifacts that no longer upload
    (failed, complete, pruned or gone): a killed agent or a failed artifact otherwise leaves parts in the
    store for ever. An uploading artifact's upload is kept, and so is anything younger than `min_age`
    seconds (an upload begun just now for an artifact registered meanwhile). Returns the keys aborted, then
    those deleted. The blob collection's upload step (app/artifacts/s3_gc.py, `tuneplane blobs gc`)."""
    from tuneplane.app.artifacts.s3_gc import collect_uploads

    return collect_uploads(db, store, min_age=min_age).upload_keys
