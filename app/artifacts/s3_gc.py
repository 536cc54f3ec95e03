"""Garbage collection in S3 stores (issue 32, lifecycle): the S3 twin of app/artifacts/gc.py's `collect`.

What may go is the database's answer, as for the filesystem store: a blob object (`<prefix>/sha256/ab/…`)
that `blob_references()` does not list. What uploads leave behind goes too: an object at an upload key
(`<prefix>/uploads/<artifact id>/…`, completed but not yet verified and moved when the server stopped) and
every multipart upload still open there, of an artifact that is no longer uploading (complete, failed,
pruned, gone) — an open multipart upload holds its parts' bytes in the store, invisible to listings of
objects, until it is aborted. An uploading artifact's upload is never touched: its agent may resume it.

The filesystem collection's lock does not reach a store other processes write to, so the age guard is
the whole protection here: nothing written (or, for an upload, started) within `min_age` seconds is
removed. A node's upload of a blob never writes a blob key (only the server copies there, after verifying
and right before recording the file), so the copy is younger than `min_age` until its record exists.
"""

from __future__ import annotations

import datetime as dt
import logging
from dataclasses import asdict, dataclass, field

from tuneplane.app.artifacts.s3_delivery import FleetStores
from tuneplane.app.db import Database
from tuneplane.app.errors import Refusal
from tuneplane.app.s3store import S3Store

log = logging.getLogger(__name__)

UPLOADS = "uploads/"


@dataclass
class S3GcReport:
    store: str
    examined: int = 0
    kept_referenced: int = 0
    kept_recent: int = 0
    removed: list[str] = field(default_factory=list)
    removed_bytes: int = 0
    removed_upload_objects: int = 0
    aborted_uploads: int = 0
    kept_uploading: int = 0
    dry_run: bool = False
    # The upload keys whose multipart upload was aborted, then the upload leftovers removed (in that order).
    upload_keys: list[str] = field(default_factory=list)

    def as_json(self) -> dict:
        data = {**asdict(self), "removed": len(self.removed)}
        del data["upload_keys"]
        return data


def _artifact_of(store: S3Store, key: str) -> str:
    """The artifact id an upload key belongs to (`<prefix>/uploads/<id>/…`), '' when it names none."""
    rest = key[len(store.key(UPLOADS)) :] if key.startswith(store.key(UPLOADS)) else ""
    return rest.split("/", 1)[0]


def collect_s3(db: Database, store: S3Store, *, min_age: float = 3600.0, dry_run: bool = False) -> S3GcReport:
    """Remove unreferenced blob objects, upload leftovers and open multipart uploads of artifacts that
    are no longer uploading, all older than `min_age` seconds."""
    report = collect_uploads(db, store, min_age=min_age, dry_run=dry_run)
    horizon = dt.datetime.now(dt.UTC) - dt.timedelta(seconds=min_age)
    referenced = {row["sha256"] for row in db.fetch_all("SELECT sha256 FROM tuneplane.blob_references()")}
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
    """Only what uploads left: abort the open multipart uploads, and remove the objects, under
    `uploads/<artifact id>/` of artifacts that no longer upload, older than `min_age` seconds."""
    report = S3GcReport(store=store.location.url, dry_run=dry_run)
    horizon = dt.datetime.now(dt.UTC) - dt.timedelta(seconds=min_age)
    # Read before listing: an artifact that starts uploading after this read begins its upload after the
    # horizon's reference point too, so the age guard keeps it.
    uploading = {
        str(row["id"]) for row in db.fetch_all("SELECT id FROM tuneplane.artifacts WHERE state = 'uploading'")
    }
    for upload in store.open_uploads(UPLOADS):
        if _artifact_of(store, upload["Key"]) in uploading:
            report.kept_uploading += 1
        elif upload["Initiated"] is None or upload["Initiated"] <= horizon:
            if not dry_run:
                store.abort_multipart(upload["Key"], upload["UploadId"])
            report.aborted_uploads += 1
            report.upload_keys.append(upload["Key"])
    for obj in store.list_objects(UPLOADS):
        if _artifact_of(store, obj["Key"]) in uploading:
            report.kept_uploading += 1
        elif obj["LastModified"] <= horizon:
            if not dry_run:
                store.delete(obj["Key"])
            report.removed_upload_objects += 1
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
    return [collect_s3(db, store, min_age=min_age, dry_run=dry_run) for store in stores]
