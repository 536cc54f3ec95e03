"""Submission calls: validate, pin, call the stored function, shape the answer. No rule lives here
beyond JobSpec validation; create_preview and confirm_preview decide."""

from __future__ import annotations

import datetime as dt
import uuid
from functools import partial
from typing import Any

from psycopg.types.json import Jsonb

from tuneplane.app import db_functions as fn
from tuneplane.app.blobstore import BlobStore
from tuneplane.app.db import Database
from tuneplane.app.errors import Refusal
from tuneplane.app.submission.jobspec import JobSpec, parse_jobspec
from tuneplane.app.submission.pins import build_pins, with_recipe_outputs

MAX_ID = 2**63 - 1


def parse_preview_id(value: Any) -> str:
    try:
        return str(uuid.UUID(str(value)))
    except ValueError:
        raise Refusal(f"no preview {value}", status=404, field="preview_id") from None


def parse_job_id(value: Any) -> int:
    try:
        job_id = int(str(value))
    except ValueError:
        raise Refusal(f"no job {value}", status=404, field="job_id") from None
    if not 0 < job_id <= MAX_ID:
        raise Refusal(f"no job {value}", status=404, field="job_id")
    return job_id


def create_preview(
    db: Database, user_id: int, data: Any, blobs: BlobStore | list[BlobStore] | None = None
) -> dict:
    """`blobs` is the store holding source archives, or the stores to look in, in order (an S3 fleet's,
    then the server's); an environment's requirements file is read from the archive there."""
    spec = with_recipe_outputs(data if isinstance(data, JobSpec) else parse_jobspec(data))
    open_archive = None
    if spec.source is not None and blobs is not None:
        sha256 = spec.source.archive.removeprefix("sha256:")
        if owns_archive(db, user_id, sha256):
            stores = blobs if isinstance(blobs, list) else [blobs]
            holder = next((b for b in stores if b.exists(sha256)), None)
            open_archive = partial(holder.open, sha256) if holder is not None else None
    pins = build_pins(spec, open_archive)
    document = spec.model_dump(mode="json", exclude_none=True)
    row = db.call(fn.create_preview, user_id, Jsonb(document), Jsonb(pins))[0]
    return preview_document(row)


def owns_archive(db: Database, user_id: int, sha256: str) -> bool:
    """Whether this user uploaded the archive (create_preview refuses the spec otherwise; nothing of another
    user's archive is read before that)."""
    row = db.fetch_one(
        "SELECT 1 AS ok FROM source_archive_uploads WHERE sha256 = %s AND user_id = %s", (sha256, user_id)
    )
    return row is not None


def get_preview(db: Database, user_id: int, preview_id: Any) -> dict:
    row = db.call(fn.get_preview, user_id, parse_preview_id(preview_id))[0]
    return preview_document(row)


def confirm(db: Database, user_id: int, preview_id: Any, digest: Any, retry_key: Any) -> dict:
    pid = parse_preview_id(preview_id)
    key = str(retry_key).strip() if retry_key not in (None, "") else f"preview-{pid}"
    row = db.call(fn.confirm_preview, user_id, pid, str(digest or "").strip().lower(), key)[0]
    return {
        "job_id": row["job_id"],
        "preview_id": str(row["preview_id"]),
        "digest": row["digest"],
        "retry_key": row["retry_key"],
        "state": row["state"],
        "state_reason": row["state_reason"],
        "created_at": row["created_at"],
        "replayed": row["replayed"],
    }


def preview_document(row: dict) -> dict:
    resolved = row["resolved"]
    expires_at: dt.datetime = row["expires_at"]
    return {
        "id": str(row["id"]),
        "digest": row["digest"],
        "created_at": row["created_at"],
        "expires_at": expires_at,
        "expired": expires_at <= dt.datetime.now(dt.UTC),
        "resolved": resolved,
        "canonical": row["canonical"],
        "observed": row["observed"],
        "summary": summary(resolved),
    }


def format_bytes(value: int) -> str:
    for unit, size in (("TiB", 1024**4), ("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
        if value >= size:
            number = round(value / size, 1)
            return f"{number:g} {unit}"
    return f"{value} B"


def describe_input(input_doc: dict) -> str:
    kind = input_doc.get("kind")
    if kind == "recipe":
        params = ", ".join(f"{k}={v}" for k, v in sorted(input_doc.get("params", {}).items()))
        return f"recipe {input_doc.get('name')}" + (f" ({params})" if params else "")
    if kind == "source":
        archive = input_doc.get("archive", {})
        return (
            f"source sha256:{archive.get('sha256', '')[:12]}… ({format_bytes(archive.get('size_bytes', 0))},"
            f" {archive.get('member_count', 0)} members): {input_doc.get('entrypoint')}"
            f" via {input_doc.get('integration')}"
        )
    if kind == "image":
        return (
            f"image {input_doc.get('image')}: {input_doc.get('command')} via {input_doc.get('integration')}"
        )
    return str(kind)


def describe_environment(env: dict) -> str:
    packages = ", ".join(f"{name} {ver}" for name, ver in sorted((env.get("packages") or {}).items()))
    return (
        f"environment sha256:{str(env.get('digest', ''))[:12]}… (base {env.get('base')}, python"
        f" {env.get('python')}, built with uv {env.get('uv')}): {packages or 'no packages'}"
    )


def describe_runtime(runtime: dict) -> str:
    if runtime.get("kind") == "image":
        return f"image {runtime.get('image')}"
    if runtime.get("environment"):
        return describe_environment(runtime["environment"])
    packages = ", ".join(
        f"{name} {ver if ver else '(not pinned)'}"
        for name, ver in sorted(runtime.get("packages", {}).items())
    )
    return f"python {runtime.get('python')}" + (f" with {packages}" if packages else "")


def describe_priority(resolved: dict) -> str | int | None:
    name = resolved.get("priority_class")
    return f"{name} ({resolved.get('priority')})" if name else resolved.get("priority")


def describe_preemption(resolved: dict) -> str:
    rules = resolved.get("preemption") or {}
    if "preemptible" not in resolved:
        return "not preemptible"
    if not resolved.get("preemptible"):
        # What the planner does (plan_preemption, admission_verdict): never a victim; on a fleet where its
        # team has a GPU guarantee it cannot borrow above it. It does not say the job runs only within one.
        return (
            "not preemptible: never asked to stop for another job; where its team has a GPU guarantee on "
            "the fleet, it cannot borrow idle GPUs above it"
        )
    return (
        "preemptible: may borrow idle GPUs above the team's guarantee; "
        f"asked to checkpoint and stop with {rules.get('signal', 'SIGTERM')} and a grace of "
        f"{rules.get('grace_seconds')} s; at most {rules.get('max_preemptions')} preemptions"
    )


def describe_resume(resume: dict) -> str:
    if resume.get("mode") == "none":
        return "never: every attempt starts from scratch"
    if resume.get("mode") == "pinned":
        return (
            f"every attempt from {resume.get('artifact_name')} of job {resume.get('job_id')}"
            f" (manifest sha256:{resume.get('manifest_digest')})"
        )
    return "a later attempt resumes from the job's newest verified checkpoint"


def summary(resolved: dict) -> dict:
    """The lines a person reads before confirming (CLI and console show the same)."""
    res = resolved.get("resources", {})
    fleet = resolved.get("fleet", {})
    chosen = "named in the spec" if fleet.get("chosen") == "named" else "chosen: the only fleet that fits"
    gpus = res.get("gpus_per_node", 0)
    integration = resolved.get("integration", {})
    memory = format_bytes(res.get("memory_per_node", 0))
    return {
        "input": describe_input(resolved.get("input", {})),
        # Whether the job may borrow above the guarantee is the preemption line's to say (one place).
        "team": (resolved.get("team") or {}).get("name", "(the owner's)"),
        "fleet": f"{fleet.get('name')} ({chosen})",
        "backend": fleet.get("backend"),
        "nodes": res.get("nodes"),
        "gpu_request": f"{res.get('total_gpus', 0)} GPU{'s' if res.get('total_gpus') != 1 else ''}"
        f" ({res.get('nodes')} × {gpus})",
        "per_node": f"{gpus} GPU, {res.get('cpus_per_node')} CPU, {memory}",
        "runtime": describe_runtime(resolved.get("runtime", {})),
        "integration": f"{integration.get('name')} sha256:{integration.get('sha256', '')[:16]}…",
        "max_attempts": resolved.get("max_attempts"),
        "priority": describe_priority(resolved),
        "preemption": describe_preemption(resolved),
        "resume": describe_resume(resolved.get("resume") or {})
        + ("; queued again after an idle-GPU reclaim" if resolved.get("resume_when_idle_reclaimed") else ""),
        "warnings": list(resolved.get("warnings", [])),
        "inputs": [
            f"{i.get('name')}: {i.get('artifact_name')} of job {i.get('job_id')}"
            f" (rank {i.get('rank')}, attempt {i.get('attempt')}), manifest sha256:{i.get('manifest_digest')}"
            for i in resolved.get("inputs", [])
        ],
        "outputs": [
            f"{o.get('name')}: {o.get('path')} (delivery {o.get('delivery') or 'the fleet default'})"
            for o in resolved.get("outputs", [])
        ],
    }
