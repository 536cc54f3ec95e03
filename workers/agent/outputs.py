"""Delivering a finished member's outputs (the spec's `outputs`) as artifacts: one try per output.

Delivery per output: what the spec asks, else object upload, falling back to the fleet's shared mount
when the fleet declares no object delivery. On the shared mount an output goes to
`<shared_path>/jobs/<job>/attempt-<n>/rank-<r>/<name>`.

`deliver_output` makes one try and says what it came to: `complete`, `retry` (the server or the network
failed: a 5xx, a connection error, an upload cut short; trying again later can succeed) or `failed` (a
refusal that will not change: a 4xx, an output directory that is not there or holds a file no manifest
can describe). The retrying, the backoff, the deadline and the durable bookkeeping live in
workers.agent.delivery.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import httpx

from tuneplane.workers.agent.prepare import NodeAccess
from tuneplane.workers.artifacts.member_logs import snapshot_logs
from tuneplane.workers.artifacts.upload import UploadError, retryable_status


@dataclass(frozen=True)
class Outcome:
    state: str  # complete | retry | failed
    reason: str = ""
    artifact_id: int | None = None


def shared_destination(member: dict, name: str) -> str:
    return (
        f"{str(member['shared_path']).rstrip('/')}/jobs/{member['job_id']}/"
        f"attempt-{member['attempt']}/rank-{member['rank']}/{name}"
    )


def planned_outputs(directory: Path) -> list[dict]:
    """The outputs the member's spec asks for (none when the member directory is not readable)."""
    try:
        spec = json.loads((directory / "capsule" / "spec.json").read_text())
    except (OSError, ValueError):
        return []
    return [dict(o) for o in spec.get("outputs") or []]


def _retryable(exc: Exception) -> bool:
    if isinstance(exc, httpx.TransportError | ConnectionError | TimeoutError):
        return True
    if isinstance(exc, UploadError):
        return exc.retryable
    return False


def deliver_output(access: NodeAccess, directory: Path, output: dict) -> Outcome:
    """One try at delivering one output (blocking: run it in a thread)."""
    from tuneplane.workers.artifacts.deliver import deliver_artifact, node_http
    from tuneplane.workers.artifacts.manifest import ManifestError

    try:
        member = json.loads((directory / "member.json").read_text())
    except (OSError, ValueError) as exc:
        return Outcome("failed", f"the member directory has no readable member.json ({exc})")
    name = output["name"]
    kind = output.get("kind") or "output"
    root = snapshot_logs(directory) if kind == "logs" else directory / "output" / output["path"]
    if not root.is_dir():
        return Outcome("failed", f"{output['path']} is not a directory in the output directory")
    choices = [output["delivery"]] if output.get("delivery") else ["object", "shared"]
    if not member.get("shared_path"):
        choices = [c for c in choices if c != "shared"] or choices
    refusals = []
    try:
        credential = access.credential()
    except Exception as exc:  # no credential now (being rotated): try again later
        return Outcome("retry", f"no node credential: {exc}")
    with node_http(access.server, credential, ca_bundle=access.ca_bundle) as http:
        for delivery in choices:
            shared = shared_destination(member, name) if delivery == "shared" else None
            try:
                result = deliver_artifact(
                    http, int(member["member_id"]), name, root, kind=kind, delivery=delivery,
                    shared_path=shared,
                )  # fmt: skip
            except ManifestError as exc:
                # The directory cannot be described (a file name with a control character or not UTF-8, a
                # link out of it, a FIFO): no try will change that, whatever the delivery.
                reason = f"{output['path'] or name} cannot be delivered: {exc}"
                return refuse_output(access, int(member["member_id"]), output, reason)
            except (UploadError, OSError, httpx.HTTPError) as exc:
                if _retryable(exc):
                    return Outcome("retry", f"{delivery} delivery: {exc}")
                refusals.append(f"{delivery} delivery: {exc}")
                continue
            state, artifact_id = result.get("state"), result.get("id")
            reason = result.get("reason") or ""
            if state == "complete":
                return Outcome("complete", "", artifact_id)
            if state == "failed":
                return Outcome("failed", reason or "the server failed the artifact", artifact_id)
            return Outcome("retry", reason or f"the upload is not finished ({state})", artifact_id)
    return Outcome("failed", "; ".join(refusals) or "no delivery was possible")


def refuse_output(access: NodeAccess, member_id: int, output: dict, reason: str) -> Outcome:
    """Record an output that was never registered as a failed artifact with the reason (what its user
    sees); `retry` while the server cannot be told."""
    from tuneplane.workers.artifacts.deliver import node_http, refuse_artifact

    try:
        with node_http(access.server, access.credential(), ca_bundle=access.ca_bundle) as http:
            artifact = refuse_artifact(
                http, member_id, output["name"], output.get("kind") or "output", reason
            )
    except (UploadError, httpx.HTTPError, OSError) as exc:
        if _retryable(exc):
            return Outcome("retry", reason)
        return Outcome("failed", reason)  # refused (e.g. it completed after all): the record keeps the reason
    except Exception as exc:  # no credential now (being rotated): tell the server later
        return Outcome("retry", f"{reason} (not recorded on the server yet: {exc})")
    return Outcome("failed", reason, artifact.get("id"))


def fail_artifact(access: NodeAccess, artifact_id: int, reason: str) -> Outcome:
    """Mark a registered artifact failed with the reason (its delivery gave up)."""
    from tuneplane.workers.artifacts.deliver import node_http

    try:
        with node_http(access.server, access.credential(), ca_bundle=access.ca_bundle) as http:
            response = http.post(f"/api/artifacts/{artifact_id}/fail", json={"reason": reason[:2000]})
    except Exception as exc:
        return Outcome("retry", f"could not mark artifact {artifact_id} failed: {exc}", artifact_id)
    if response.is_success or response.status_code == 409:  # 409: it completed after all
        return Outcome("failed", reason, artifact_id)
    if retryable_status(response.status_code):
        return Outcome(
            "retry", f"HTTP {response.status_code} marking artifact {artifact_id} failed", artifact_id
        )
    return Outcome("failed", reason, artifact_id)
