"""Publishing a checkpoint directory while its member keeps running: one artifact version (kind
`checkpoint`, named `<name>.<n>`) with its manifest, or a failed artifact that says why.

The workload may still be writing: a directory that changes while it is being read must never become a
complete artifact with bytes of two versions. Every byte the server accepts is checked against the
manifest, so the manifest alone decides what the artifact holds; it is consistent when no file was
added, removed or modified (size, mtime, ctime, inode) between the moment before the first file was
hashed and the moment after the last one. A change in that window refuses the checkpoint; a change
later, during the upload, makes the server refuse the changed file's bytes and the checkpoint is refused
naming the changed files. Either way the artifact is failed with the reason.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import httpx

from tuneplane.workers.artifacts.deliver import fail_artifact, register
from tuneplane.workers.artifacts.manifest import ManifestError, build_manifest, walk_files
from tuneplane.workers.artifacts.upload import HttpChunkTransport, UploadError, upload_artifact

Snapshot = dict[str, tuple[int, int, int, int]]


def snapshot(root: Path) -> Snapshot:
    """path → (size, mtime_ns, ctime_ns, inode) of every file under root (what a change would alter)."""
    state: Snapshot = {}
    for rel, full in walk_files(root):
        info = os.stat(full)
        state[rel] = (info.st_size, info.st_mtime_ns, info.st_ctime_ns, info.st_ino)
    return state


def changes(before: Snapshot, after: Snapshot) -> list[str]:
    """What differs, named: `added: P`, `removed: P`, `modified: P` (sorted by path)."""
    found = [f"added: {p}" for p in after.keys() - before.keys()]
    found += [f"removed: {p}" for p in before.keys() - after.keys()]
    found += [f"modified: {p}" for p in before.keys() & after.keys() if before[p] != after[p]]
    return sorted(found, key=lambda item: item.split(": ", 1)[1])


def changed_reason(found: list[str]) -> str:
    shown = "; ".join(found[:10]) + (f"; … {len(found) - 10} more" if len(found) > 10 else "")
    return f"the checkpoint directory changed while it was being read ({shown}); refused"


def publish_checkpoint(
    http: httpx.Client,
    member_id: int,
    name: str,
    root: Path | str,
    *,
    retry_later: bool = True,
    step: int | None = None,
) -> dict[str, Any]:
    """Register and upload `root` as checkpoint artifact `name` (holding training step `step`, when the
    workload said it); returns the artifact as the server last
    reported it (`state` complete or failed, `reason`). Raises UploadError when the server cannot be
    reached or failed (5xx) while the directory stayed unchanged and `retry_later`: the caller tries again
    later, and the same manifest resumes the same upload (without `retry_later` the artifact is failed)."""
    root = Path(root)
    try:
        before = snapshot(root)
        manifest = build_manifest(root)
        after = snapshot(root)
    except (ManifestError, OSError) as exc:
        return {"id": None, "name": name, "state": "failed", "reason": f"not a readable checkpoint: {exc}"}
    artifact = register(http, member_id, name, manifest, kind="checkpoint", step=step)
    if artifact["state"] == "complete":
        return artifact
    found = changes(before, after)
    if found:
        return fail_artifact(http, artifact["id"], changed_reason(found))
    reason = None
    transient: UploadError | None = None
    try:
        result = upload_artifact(root, manifest, HttpChunkTransport(http, artifact["id"]))
        if result.state == "complete":
            return {**artifact, "state": "complete", "reason": result.reason}
        reason = result.reason
    except (UploadError, OSError) as exc:
        reason = str(exc)
        transient = exc if isinstance(exc, UploadError) and exc.retryable else None
    try:
        found = changes(before, snapshot(root))
    except (ManifestError, OSError) as exc:
        found = [f"unreadable: {exc}"]
    if found:
        return fail_artifact(http, artifact["id"], changed_reason(found))
    if transient is not None and retry_later:
        # The server failed or went away (5xx, no answer) and the directory is as it was: the caller tries
        # again at its next scan, resuming the same registration. Failing the checkpoint here lost it for
        # good to an outage that ended a moment later.
        raise transient
    return fail_artifact(http, artifact["id"], f"upload failed: {reason}")
