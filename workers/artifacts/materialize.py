"""Materializing a job's pinned inputs on a node and verifying them before the member reports PREPARED.

The pin comes from the job's preview (resolved `inputs`: artifact id and manifest digest). The node
fetches the manifest, checks that it hashes to the pinned digest (the server's word is not enough),
places every file (a copy from the fleet's shared mount when the artifact lies there and is visible,
else a download through the artifact endpoints), and then re-hashes the whole directory against the
manifest. Calling it again on a directory that already verifies does nothing, so a retried PREPARE is
cheap.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tuneplane.workers.artifacts.manifest import Manifest, ManifestError
from tuneplane.workers.artifacts.verify import VerifyReport, verify_directory

if TYPE_CHECKING:
    # Imported where a download needs it: a Slurm step imports this module for its shared-path resume on
    # every member start, and httpx (with rich and click) was 0.18 s of that step's imports (issue 23).
    import httpx

PARTIAL = ".tuneplane-partial"
# How long, in all, a GET answered 503 with Retry-After (the gateway's database away: a failover, issue 33) is
# sent again after the pause it asks for, before the prepare fails.
WAIT_OUT_503_S = 60.0


class MaterializeError(RuntimeError):
    """An input could not be placed or does not verify; the message names the input and every file."""


def _waited_out(response: httpx.Response, deadline: float) -> bool:
    """Whether this answer was a 503 asking for a pause that fits before `deadline`, now waited: the caller
    sends the same GET again (a read, safe to repeat)."""
    from tuneplane.app.client.transport import retry_after

    pause = retry_after(response.status_code, response.headers.get("Retry-After"))
    if pause is None or time.monotonic() + pause > deadline:
        return False
    response.read()
    time.sleep(pause)
    return True


def fetch_manifest(http: httpx.Client, pinned: dict[str, Any]) -> Manifest:
    deadline = time.monotonic() + WAIT_OUT_503_S
    response = http.get(f"/api/input-artifacts/{pinned['artifact_id']}")
    while _waited_out(response, deadline):
        response = http.get(f"/api/input-artifacts/{pinned['artifact_id']}")
    if not response.is_success:
        raise MaterializeError(f"input {pinned['name']}: the server refused the manifest: {_error(response)}")
    try:
        manifest = Manifest.from_json(response.json()["manifest"])
    except (ManifestError, KeyError, ValueError) as exc:
        raise MaterializeError(f"input {pinned['name']}: unusable manifest ({exc})") from exc
    if manifest.digest != pinned["manifest_digest"]:
        raise MaterializeError(
            f"input {pinned['name']}: the manifest hashes to {manifest.digest}, "
            f"the job pinned {pinned['manifest_digest']}; refusing it"
        )
    return manifest


def _error(response: httpx.Response) -> str:
    try:
        return response.json().get("error") or f"HTTP {response.status_code}"
    except ValueError:
        return f"HTTP {response.status_code}"


def _download(http: httpx.Client, artifact_id: int, index: int, entry_sha: str, target: Path) -> None:
    """One file into `target`, hashed as it arrives. From the server, or, for an S3 fleet, straight from the
    store: the server answers 307 with a URL signed for this one object (app/artifacts/s3_reads.py), fetched
    without the node's credential. Bytes from the store that do not match are reported, so the server
    re-reads the object and marks the artifact corrupt if its own hash disagrees (never resumed from)."""
    import httpx

    partial = target.parent / f"{PARTIAL}-{target.name}"
    target.parent.mkdir(parents=True, exist_ok=True)
    path = f"/api/input-artifacts/{artifact_id}/files/{index}"
    digest = hashlib.sha256()
    from_store = False
    deadline = time.monotonic() + WAIT_OUT_503_S
    try:
        while True:
            with http.stream("GET", path) as response:
                if _waited_out(response, deadline):
                    continue
                if response.status_code == 307 and response.headers.get("Location"):
                    from_store = True
                    _fetch_from_store(http, response.headers["Location"], partial, digest)
                else:
                    _write_body(response, partial, digest)
            break
    except httpx.HTTPError as exc:
        partial.unlink(missing_ok=True)
        raise MaterializeError(f"transfer failed: {exc}") from exc
    if digest.hexdigest() != entry_sha:
        partial.unlink(missing_ok=True)
        if from_store:
            raise MaterializeError(_report_mismatch(http, path))
        raise MaterializeError("downloaded bytes do not match the manifest")
    os.replace(partial, target)


def _write_body(response: httpx.Response, partial: Path, digest: Any) -> None:
    if not response.is_success:
        response.read()
        raise MaterializeError(_error(response))
    with open(partial, "wb") as handle:
        for block in response.iter_bytes(1024 * 1024):
            digest.update(block)
            handle.write(block)


def _fetch_from_store(http: httpx.Client, url: str, partial: Path, digest: Any) -> None:
    """GET a presigned URL with a client of its own: the node's credential never goes to the store, and
    plain HTTP only to loopback, as for the server (check_transport)."""
    import httpx

    from tuneplane.app.client.http import ClientError, check_transport

    try:
        check_transport(url)
    except ClientError as exc:
        raise MaterializeError(f"the object store's URL: {exc}") from exc
    client = httpx.Client(timeout=http.timeout, verify=_store_tls())
    with client, client.stream("GET", url) as response:
        if not response.is_success:
            response.read()
            raise MaterializeError(f"the object store answered HTTP {response.status_code}")
        _write_body(response, partial, digest)


def _store_tls() -> Any:
    from tuneplane.workers.artifacts.deliver import tls_context

    return tls_context(None)  # the store is verified against the system's trust store


def _report_mismatch(http: httpx.Client, path: str) -> str:
    """Tell the server; its answer says whether its own re-read found the stored object corrupt."""
    import httpx

    why = "the bytes the object store sent do not match the manifest"
    try:
        answer = http.post(f"{path}/mismatch")
    except httpx.HTTPError as exc:
        return f"{why} (reporting it failed: {exc})"
    if not answer.is_success:
        return f"{why} (reporting it failed: {_error(answer)})"
    if answer.json().get("corrupt"):
        return f"{why}; the server re-read the stored object and marked the artifact corrupt"
    return f"{why}; the server's re-read of the stored object matched (damaged in transit)"


def materialize_input(http: httpx.Client, pinned: dict[str, Any], dest: Path | str) -> VerifyReport:
    """Place one pinned input at dest and verify it; raises MaterializeError naming every bad file."""
    manifest = fetch_manifest(http, pinned)
    return _place(
        manifest,
        pinned,
        Path(dest),
        lambda index, entry, target: _download(http, pinned["artifact_id"], index, entry.sha256, target),
    )


def materialize_shared(pinned: dict[str, Any], manifest_json: dict, dest: Path | str) -> VerifyReport:
    """Place one pinned artifact that lies on the fleet's shared path (delivery `shared`) at dest and verify
    it, without the server: the manifest comes with the pin (a Slurm job step holds no credential) and must
    hash to the pinned digest. Raises MaterializeError naming the artifact and every bad file."""
    try:
        manifest = Manifest.from_json(manifest_json)
    except (ManifestError, KeyError, TypeError, ValueError) as exc:
        raise MaterializeError(f"input {pinned['name']}: unusable manifest ({exc})") from exc
    if manifest.digest != pinned["manifest_digest"]:
        raise MaterializeError(
            f"input {pinned['name']}: the manifest hashes to {manifest.digest}, "
            f"the job pinned {pinned['manifest_digest']}; refusing it"
        )
    shared = pinned.get("shared_path")
    if pinned.get("delivery") != "shared" or not shared or not Path(shared).is_dir():
        raise MaterializeError(
            f"input {pinned['name']}: not on the shared path here (delivery {pinned.get('delivery')}, "
            f"path {shared}); it cannot be read without the server"
        )

    def unreachable(_index: int, _entry: Any, _target: Path) -> None:
        raise MaterializeError("not on the shared path")

    return _place(manifest, pinned, Path(dest), unreachable)


def _place(manifest: Manifest, pinned: dict[str, Any], dest: Path, download) -> VerifyReport:
    """Every file of the manifest at dest (a copy from the shared path when the artifact lies there and is
    visible, else `download(index, entry, target)`), then the whole directory verified against it."""
    if dest.is_dir():
        report = verify_directory(dest, manifest)
        if report.ok:
            return report
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    shared = pinned.get("shared_path")
    use_shared = pinned.get("delivery") == "shared" and shared and Path(shared).is_dir()
    problems: list[str] = []
    for index, entry in enumerate(manifest.files):
        target = dest / entry.path
        try:
            if use_shared:
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(Path(shared) / entry.path, target)
            elif entry.size == 0:  # nothing to fetch (an S3 store holds no object for an empty file)
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(b"")
            else:
                download(index, entry, target)
        except (MaterializeError, OSError) as exc:
            problems.append(f"{entry.path}: {exc}")
    if problems:
        raise MaterializeError(f"input {pinned['name']}: " + "; ".join(problems))
    report = verify_directory(dest, manifest)
    if not report.ok:
        raise MaterializeError(f"input {pinned['name']} does not verify: " + "; ".join(report.problems()))
    return report


def materialize_inputs(http: httpx.Client, inputs: list[dict[str, Any]], input_root: Path | str) -> dict:
    """Every pinned input of a job under input_root/<name> (or input_root/<path>); returns per input what
    was verified. The agent calls this in PREPARE and reports FAILED with the error's message."""
    root = Path(input_root)
    done: dict[str, Any] = {}
    for pinned in inputs:
        relative = pinned.get("path") or pinned["name"]
        target = (root / relative).resolve()
        if not str(target).startswith(str(root.resolve()) + os.sep):
            raise MaterializeError(f"input {pinned['name']}: path {relative} leaves the input directory")
        report = materialize_input(http, pinned, target)
        done[pinned["name"]] = {
            "path": str(target),
            "manifest_digest": pinned["manifest_digest"],
            "files": report.checked,
            "bytes": report.bytes_checked,
        }
    return done
