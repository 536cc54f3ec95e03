"""Delivering a finished member's outputs (the spec's `outputs`) as artifacts, before its exit is reported.

Delivery per output: what the spec asks, else object upload, falling back to the fleet's shared mount
when the fleet declares no object delivery. On the shared mount an output goes to
`<shared_path>/jobs/<job>/attempt-<n>/rank-<r>/<name>`.
"""

from __future__ import annotations

import json
from pathlib import Path

from workers.agent.prepare import NodeAccess


def shared_destination(member: dict, name: str) -> str:
    return (
        f"{str(member['shared_path']).rstrip('/')}/jobs/{member['job_id']}/"
        f"attempt-{member['attempt']}/rank-{member['rank']}/{name}"
    )


def deliver_outputs(access: NodeAccess, directory: Path) -> str | None:
    """None when every output was delivered (or there are none); else what went wrong, per output."""
    try:
        spec = json.loads((directory / "capsule" / "spec.json").read_text())
        member = json.loads((directory / "member.json").read_text())
    except (OSError, ValueError):
        return None
    outputs = spec.get("outputs") or []
    if not outputs:
        return None
    from workers.artifacts.deliver import deliver_artifact, node_http
    from workers.artifacts.upload import UploadError

    problems = []
    with node_http(access.server, access.credential(), ca_bundle=access.ca_bundle) as http:
        for output in outputs:
            name = output["name"]
            root = directory / "output" / output["path"]
            if not root.is_dir():
                problems.append(f"output {name}: {output['path']} is not a directory in the output directory")
                continue
            choices = [output["delivery"]] if output.get("delivery") else ["object", "shared"]
            if not member.get("shared_path"):
                choices = [c for c in choices if c != "shared"] or choices
            error = None
            for delivery in choices:
                shared = shared_destination(member, name) if delivery == "shared" else None
                try:
                    result = deliver_artifact(
                        http, int(member["member_id"]), name, root, delivery=delivery, shared_path=shared
                    )
                except (UploadError, OSError) as exc:
                    error = str(exc)
                    continue
                error = (
                    None
                    if result.get("state") == "complete"
                    else (result.get("reason") or result.get("state"))
                )
                break
            if error:
                problems.append(f"output {name}: {error}")
    return "; ".join(problems) or None
