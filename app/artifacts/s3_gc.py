"""Garbage collection in S3 stores (issue 32, lifecycle): the S3 twin of app/artifacts/gc.py's `collect`.

What may go is the database's answer, as for the filesystem store, in two areas under the store's prefix:
- content-addressed blobs (`sha256/ab/…`: source archives, capsules, S3 files recorded before 0320): a
  blob that `blob_references()` does not list;
- artifact files (`artifacts/<artifact id>/<file index>`, where a node's upload lands and is verified in
  place): an object that `artifact_object_references()` does not list (no needed file names it: its
  artifact failed, was pruned, is gone, and no other artifact reuses it) and whose artifact is not
  uploading (its agent may resume, or the server may be between completing and recording it) — and every
  multipart upload still open there of an artifact that is no longer uploading: an open multipart upload
  holds its parts' bytes in the store, invisible to listings of objects, until it is aborted.

The filesystem collection's lock does not reach a store other processes write to, so the age guard is the
other protection here: nothing written (or, for an upload, started) within `min_age` seconds is removed.
A blob key is written only by the server (`commit_staged`) right before it records what needs it; an
artifact object is protected by its uploading artifact until it is recorded, and reuse by another artifact
is recorded under a lock that retention's pruning waits for (reuse_artifact_objects).
"""

from __future__ import annotations

import datetime as dt
import logging
from dataclasses import asdict, dataclass, field

from botocore.exceptions import BotoCoreError, ClientError

from tuneplane.app import db_functions as fn
from tuneplane.app.artifacts.s3_delivery import OBJECTS, FleetStores
from tuneplane.app.db import Database
from tuneplane.app.errors import Refusal
from tuneplane.app.s3store import S3Store

log = logging.getLogger(__name__)


@dataclass
class S3GcReport:
    store: str
    examined: int = 0
    kept_referenced: int = 0
    kept_recent: int = 0
    removed: list[str] = field(default_factory=list)
    removed_bytes: int = 0
    removed_objects: int = 0
    aborted_uploads: int = 0
    kept_uploading: int = 0
    dry_run: bool = False
    # The artifact keys whose multipart upload was aborted, then the artifact objects removed (in that order).
    upload_keys: list[str] = field(default_factory=list)
    # Why this store was not (fully) collected: unreachable, bucket gone, keys refused; None when it was.
    error: str | None = None

    def as_json(self) -> dict:
        data = {**asdict(self), "removed": len(self.removed)}
        del data["upload_keys"]
        return data


def _artifact_of(store: S3Store, key: str) -> str:
    """The artifact id an object key belongs to (`<prefix>/artifacts/<id>/…`), '' when it names none."""
    rest = key[len(store.key(OBJECTS)) :] if key.startswith(store.key(OBJECTS)) else ""
    return rest.split("/", 1)[0]


def collect_s3(db: Database, store: S3Store, *, min_age: float = 3600.0, dry_run: bool = False) -> S3GcReport:
    """Remove unreferenced blob objects and artifact objects, and abort the open multipart uploads of
    artifacts that are no longer uploading, all older than `min_age` seconds."""
    report = collect_uploads(db, store, min_age=min_age, dry_run=dry_run)
    horizon = dt.datetime.now(dt.UTC) - dt.timedelta(seconds=min_age)
    referenced = {row["sha256"] for row in db.call(fn.blob_references)}
    for obj in store.list_objects("sha256/"):
        report.examined += 1
        digest = obj["Key"].rsplit("/", 1)[-1]
        if digest in referenced:
            report.kept_referenced += 1
        elif obj["LastModified"] > horizon:
            report.kept_recent += 1
        else:
            if not dry_run:
                store.delete(obj["Key"])
            report.removed.append(digest)
            report.removed_bytes += obj["Size"]
    log.info("s3 gc: %s", report.as_json())
    return report


def collect_uploads(
    db: Database, store: S3Store, *, min_age: float = 3600.0, dry_run: bool = False
) -> S3GcReport:
    """The artifact area only: abort the open multipart uploads of artifacts that no longer upload, and
    remove the objects no needed file names (artifact_object_references) of artifacts that no longer
    upload, older than `min_age` seconds."""
    report = S3GcReport(store=store.location.url, dry_run=dry_run)
    horizon = dt.datetime.now(dt.UTC) - dt.timedelta(seconds=min_age)
    # Uploading first, references second: an artifact that stops uploading in between is complete (its
    # objects are referenced by the second read) or failed (they may go). One that starts uploading after
    # the first read begins its upload after the horizon's reference point, so the age guard keeps it.
    uploading = {
        str(row["id"]) for row in db.fetch_all("SELECT id FROM tuneplane.artifacts WHERE state = 'uploading'")
    }
    referenced = {store.key(row["object_key"]) for row in db.call(fn.artifact_object_references)}
    for upload in store.open_uploads(OBJECTS):
        if _artifact_of(store, upload["Key"]) in uploading:
            report.kept_uploading += 1
        elif upload["Initiated"] is None or upload["Initiated"] <= horizon:
            if not dry_run:
                store.abort_multipart(upload["Key"], upload["UploadId"])
            report.aborted_uploads += 1
            report.upload_keys.append(upload["Key"])
    for obj in store.list_objects(OBJECTS):
        report.examined += 1
        if obj["Key"] in referenced:
            report.kept_referenced += 1
        elif _artifact_of(store, obj["Key"]) in uploading:
            report.kept_uploading += 1
        elif obj["LastModified"] > horizon:
            report.kept_recent += 1
        else:
            if not dry_run:
                store.delete(obj["Key"])
            report.removed_objects += 1
            report.removed_bytes += obj["Size"]
            report.upload_keys.append(obj["Key"])
    return report


def fleet_stores(db: Database) -> list[S3Store]:
    """One store per distinct S3 location the fleets name (fleets.storage), with the server's credentials
    (FleetStores, as direct delivery makes them). Refusal (503) when a fleet names one and the server holds
    no credentials."""
    rows = db.fetch_all(
        "SELECT DISTINCT storage FROM tuneplane.fleets WHERE storage IS NOT NULL AND storage->>'kind' = 's3'"
    )
    stores = FleetStores()
    return [stores.store(row["storage"]) for row in rows]


def collect_fleet_stores(db: Database, *, min_age: float = 3600.0, dry_run: bool = False) -> list[S3GcReport]:
    """`collect_s3` over every fleet's S3 store (`tuneplane blobs gc`, the worker's blob sweep)."""
    try:
        stores = fleet_stores(db)
    except Refusal as exc:
        log.warning("s3 gc skipped: %s", exc.message)
        return []
    return [_collect_or_report(db, store, min_age=min_age, dry_run=dry_run) for store in stores]


def _collect_or_report(db: Database, store: S3Store, *, min_age: float, dry_run: bool) -> S3GcReport:
    """`collect_s3`, or a report naming why it could not be done: one fleet's store that cannot be reached
    (a wrong endpoint, a deleted bucket, refused keys) must not stop the collection of the others, nor
    end `tuneplane blobs gc` in a traceback. Nothing is lost by stopping midway: the next run starts over."""
    try:
        return collect_s3(db, store, min_age=min_age, dry_run=dry_run)
    except (BotoCoreError, ClientError) as exc:
        where = store.location.url + (f" at {store.location.endpoint}" if store.location.endpoint else "")
        log.warning("s3 gc of %s failed: %s", where, exc)
        return S3GcReport(store=store.location.url, dry_run=dry_run, error=f"{type(exc).__name__}: {exc}")
