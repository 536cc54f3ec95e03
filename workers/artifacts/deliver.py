"""Delivering a member's output directory as an artifact, the way the fleet declares: upload the files in
chunks to the server (object delivery) or place them on the shared mount and register them there.

`deliver_artifact` is what the node agent calls when a member finishes (and for checkpoints while it
runs). Run as a module it delivers one directory, for operators and tests:

    TUNEPLANE_NODE_CREDENTIAL=tpn_… python -m tuneplane.workers.artifacts.deliver \
        --server http://127.0.0.1:8080 --member-id 12 --name model ./out/model
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import shutil
import ssl
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from tuneplane.workers.artifacts.manifest import Manifest, build_manifest
from tuneplane.workers.artifacts.upload import (
    INLINE_MAX_BYTES,
    INLINE_MAX_FILES,
    HttpChunkTransport,
    UploadError,
    upload_artifact,
)

ENV_CREDENTIAL = "TUNEPLANE_NODE_CREDENTIAL"


def node_http(
    server: str, credential: str, *, ca_bundle: str | None = None, timeout: float = 60.0
) -> httpx.Client:
    """An HTTP client that authenticates as the node (TLS verification on; plain HTTP only to loopback)."""
    from tuneplane.app.client.http import check_transport

    check_transport(server)
    return httpx.Client(
        base_url=server.rstrip("/"),
        headers={"Authorization": f"Node {credential}", "Accept": "application/json"},
        timeout=timeout,
        verify=tls_context(ca_bundle),
    )


_TLS_CONTEXTS: dict[tuple[str | None, float | None], ssl.SSLContext] = {}


def tls_context(ca_bundle: str | None) -> ssl.SSLContext:
    """The verifying TLS context for `ca_bundle` (None: the system's trust store), made once per bundle and
    its modification time. Building one reads and parses every trusted certificate — most of the 30-80 ms
    a new httpx.Client costs — and the agent opens a client for every member's delivery, all of them at
    once when a gang ends (issue 23). Verification stays on (httpx's own default context, or the bundle's)."""
    try:
        changed = os.stat(ca_bundle).st_mtime if ca_bundle else None
    except OSError:
        changed = None  # httpx names the missing file when it loads it below
    key = (ca_bundle, changed)
    context = _TLS_CONTEXTS.get(key)
    if context is None:
        context = ssl.create_default_context(cafile=ca_bundle) if ca_bundle else httpx.create_ssl_context()
        # A rotated bundle's older contexts are never asked for again: only the newest is kept.
        for old in [k for k in _TLS_CONTEXTS if k[0] == ca_bundle]:
            del _TLS_CONTEXTS[old]
        _TLS_CONTEXTS[key] = context
    return context


def _checked(response: httpx.Response) -> dict[str, Any]:
    try:
        body = response.json()
    except ValueError:
        body = {}
    if not response.is_success:
        raise UploadError(
            f"server refused: {body.get('error') or f'HTTP {response.status_code}'}", response.status_code
        )
    return body


def register(
    http: httpx.Client,
    member_id: int,
    name: str,
    manifest: Manifest,
    *,
    kind: str = "output",
    delivery: str = "object",
    shared_path: str | None = None,
    step: int | None = None,
    inline: dict[str, str] | None = None,
) -> dict[str, Any]:
    payload = {
        "member_id": member_id,
        "name": name,
        "kind": kind,
        "delivery": delivery,
        "shared_path": shared_path,
        "manifest": manifest.as_json(),
        "manifest_digest": manifest.digest,
    }
    if step is not None:  # a checkpoint's training step, sent only when the workload said it
        payload["step"] = step
    if inline:
        payload["inline"] = inline
    return _checked(http.post("/api/artifacts", json=payload))


def inline_files(root: Path, manifest: Manifest, limit: int = INLINE_MAX_BYTES) -> dict[str, str] | None:
    """The files of a small artifact (at most `limit` bytes in INLINE_MAX_FILES files) as the
    registration's `inline`: {path: base64}. None for a larger one or a file that cannot be read now (the
    chunk upload then says why). A file changed since the manifest was built is not verified by the
    server; its chunk upload finds the difference as before."""
    sized = [f for f in manifest.files if f.size]
    if not sized or len(sized) > INLINE_MAX_FILES or sum(f.size for f in sized) > limit:
        return None
    try:
        return {f.path: base64.b64encode((root / f.path).read_bytes()).decode("ascii") for f in sized}
    except OSError:
        return None


def place_on_shared_mount(root: Path, destination: Path) -> None:
    """Copy the directory to its place on the shared mount (skipped when it already is that place)."""
    if destination.exists() and os.path.samefile(root, destination):
        return
    if destination.exists():
        shutil.rmtree(destination)
    destination.parent.mkdir(parents=True, exist_ok=True)
    shutil.copytree(root, destination, symlinks=False)


def deliver_artifact(
    http: httpx.Client,
    member_id: int,
    name: str,
    root: Path | str,
    *,
    kind: str = "output",
    delivery: str = "object",
    shared_path: str | None = None,
    on_chunk: Callable[[str, int, int], None] | None = None,
    inline_max_bytes: int = INLINE_MAX_BYTES,
) -> dict[str, Any]:
    """Build the manifest, register, and deliver; returns the artifact as the server reports it.
    An artifact of at most `inline_max_bytes` travels inside its registration (0: always in chunks).

    Safe to call again after a crash: registering the same manifest returns the same artifact and the
    upload resumes from the chunks the server already holds.
    """
    root = Path(root)
    manifest = build_manifest(root)
    if delivery == "shared":
        if not shared_path:
            raise UploadError("shared delivery needs the artifact's directory on the shared mount")
        place_on_shared_mount(root, Path(shared_path))
    # A small artifact goes whole with its registration; what the server could not verify from it (a file
    # changed since the manifest, an older server that ignores `inline`) goes by the chunk upload below.
    inline = inline_files(root, manifest, inline_max_bytes) if delivery == "object" else None
    artifact = register(
        http, member_id, name, manifest, kind=kind, delivery=delivery, shared_path=shared_path, inline=inline
    )
    if artifact["state"] != "uploading" or delivery == "shared":
        return artifact
    transport = HttpChunkTransport(http, artifact["id"])
    try:
        result = upload_artifact(root, manifest, transport, on_chunk=on_chunk)
    except (UploadError, OSError) as exc:
        # OSError: a file vanished or became unreadable after the manifest was built. Like a file that
        # shrank, the artifact stays registered (uploading) and the next try describes the directory anew;
        # raising instead made the caller give the output up while the server kept it uploading for ever.
        return {**artifact, "state": "uploading", "reason": str(exc)}
    return {**artifact, "state": result.state, "reason": result.reason, "chunks_sent": result.chunks_sent}


def fail_artifact(http: httpx.Client, artifact_id: int, reason: str) -> dict[str, Any]:
    return _checked(http.post(f"/api/artifacts/{artifact_id}/fail", json={"reason": reason}))


def refuse_artifact(http: httpx.Client, member_id: int, name: str, kind: str, reason: str) -> dict[str, Any]:
    """Record an artifact that cannot be delivered (no manifest could be built, or it was never registered)
    as failed with the reason, so its user sees why (`refuse_artifact`)."""
    body = {"member_id": member_id, "name": name, "kind": kind, "reason": reason[:2000]}
    return _checked(http.post("/api/artifacts/refused", json=body))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tuneplane.workers.artifacts.deliver")
    parser.add_argument("--server", required=True)
    parser.add_argument("--member-id", type=int, required=True)
    parser.add_argument("--name", required=True)
    parser.add_argument("--kind", default="output")
    parser.add_argument("--delivery", default="object", choices=["object", "shared"])
    parser.add_argument("--shared-path")
    parser.add_argument("--progress", action="store_true", help="print one line per chunk sent")
    parser.add_argument("directory")
    args = parser.parse_args(argv)
    credential = os.environ.get(ENV_CREDENTIAL)
    if not credential:
        print(f"error: set {ENV_CREDENTIAL}", file=sys.stderr)
        return 2

    def progress(path: str, index: int, size: int) -> None:
        print(f"chunk {path} {index} {size}", flush=True)

    with node_http(args.server, credential) as http:
        try:
            result = deliver_artifact(
                http, args.member_id, args.name, args.directory, kind=args.kind, delivery=args.delivery,
                shared_path=args.shared_path, on_chunk=progress if args.progress else None,
            )  # fmt: skip
        except UploadError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
    print(json.dumps({k: result.get(k) for k in ("id", "state", "reason", "manifest_digest")}), flush=True)
    return 0 if result.get("state") == "complete" else 1


if __name__ == "__main__":
    sys.exit(main())
