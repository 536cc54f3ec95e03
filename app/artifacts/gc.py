"""Blob garbage collection: remove blobs that no artifact, source archive or capsule needs any more.

What is needed is the database's answer (`blob_references()`, sql/functions/artifacts.sql): files of
artifacts that are uploading or complete, files of pruned or failed artifacts still pinned by a job that
has not ended, every source archive and every attempt's capsule. Everything else under
<blob dir>/sha256/ may go — with two guards against a blob that is about to become needed:

- The artifact receiver holds the store's gc lock *shared* from the moment it puts (or finds) a blob
  until the database has recorded the file that uses it; a collection holds it *exclusively* while it
  reads the references and deletes. So a blob an upload just placed or reused is either in the
  references the collection reads, or placed after the collection ended.
- Writers that do not take the lock (source-archive uploads, capsule builds) are covered by age: a blob
  modified within `min_age` seconds is kept (a reused blob is touched by its writer).

The same collection removes what uploads left behind, with the same age guard: the staged files of an
artifact that is no longer uploading (failed, complete, pruned or gone; a failed upload's staged bytes
otherwise stayed for ever) and temporary files of uploads that never finished (`<blob dir>/tmp`). The
staged files of an uploading artifact are never touched.

Run by an operator (`tuneplane blobs gc`, docs/artifacts.md) and on a schedule by the worker's sweeps
(workers/sweeps.py, every 6 hours).
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import shutil
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from tuneplane.app.db import Database
from tuneplane.workers.disk_usage import tree_usage

log = logging.getLogger(__name__)

DEFAULT_MIN_AGE = 3600.0
LOCK_NAME = "gc.lock"


@contextlib.contextmanager
def gc_lock(blob_dir: Path, *, exclusive: bool) -> Iterator[None]:
    """The blob store's collection lock (flock on <blob dir>/gc.lock): shared for writers that place or
    reuse a blob and then record it, exclusive for a collection."""
    blob_dir.mkdir(parents=True, exist_ok=True)
    with open(blob_dir / LOCK_NAME, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


@dataclass
class GcReport:
    examined: int = 0
    kept_referenced: int = 0
    kept_recent: int = 0
    removed: list[str] = field(default_factory=list)
    removed_bytes: int = 0
    removed_leftovers: int = 0  # staging directories of artifacts no longer uploading, stale temp files
    leftover_bytes: int = 0
    dry_run: bool = False

    def as_json(self) -> dict:
        return {
            "examined": self.examined,
            "kept_referenced": self.kept_referenced,
            "kept_recent": self.kept_recent,
            "removed": len(self.removed),
            "removed_bytes": self.removed_bytes,
            "removed_leftovers": self.removed_leftovers,
            "leftover_bytes": self.leftover_bytes,
            "dry_run": self.dry_run,
        }


def collect(
    db: Database, blob_dir: Path | str, *, min_age: float = DEFAULT_MIN_AGE, dry_run: bool = False
) -> GcReport:
    """Remove every blob under blob_dir/sha256 that blob_references() does not list and that is older
    than min_age seconds. Holds the gc lock exclusively throughout."""
    root = Path(blob_dir)
    report = GcReport(dry_run=dry_run)
    with gc_lock(root, exclusive=True):
        referenced = {row["sha256"] for row in db.fetch_all("SELECT sha256 FROM tuneplane.blob_references()")}
        horizon = time.time() - min_age
        for path in sorted((root / "sha256").glob("??/*")):
            report.examined += 1
            if path.name in referenced:
                report.kept_referenced += 1
                continue
            try:
                stat = path.stat()
            except FileNotFoundError:
                continue
            if stat.st_mtime > horizon:
                report.kept_recent += 1
                continue
            if not dry_run:
                path.unlink(missing_ok=True)
            report.removed.append(path.name)
            report.removed_bytes += stat.st_size
        _collect_leftovers(db, root, horizon, report)
    log.info("blob gc: %s", report.as_json())
    return report


def _collect_leftovers(db: Database, root: Path, horizon: float, report: GcReport) -> None:
    uploading = {
        str(row["id"]) for row in db.fetch_all("SELECT id FROM tuneplane.artifacts WHERE state = 'uploading'")
    }
    staging = root / "staging" / "artifacts"
    candidates = [d for d in sorted(staging.glob("*")) if d.is_dir() and d.name not in uploading]
    candidates += [f for f in sorted((root / "tmp").glob("*")) if f.is_file()]
    for path in candidates:
        try:
            usage = tree_usage(path)
        except FileNotFoundError:
            continue
        if usage.newest > horizon:
            continue  # written lately: an upload may still be at work (registered again, finishing)
        if not report.dry_run:
            if path.is_dir():
                shutil.rmtree(path, ignore_errors=True)
            else:
                path.unlink(missing_ok=True)
        report.removed_leftovers += 1
        report.leftover_bytes += usage.bytes
