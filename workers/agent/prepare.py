"""The steps of PREPARE on the node, run by the launch handlers as one asyncio task per member.

Blocking work runs in threads and a cold image pull in a subprocess, so a long preparation never stalls
the agent's event loop (heartbeats, other members). Every failure raises with the reason the job shows.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import shutil
import tarfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp

from app.node_gateway import protocol
from workers.agent.probe import peer_check, storage_check
from workers.capsule import unpack_capsule
from workers.runner.runtime import check_runtime

# What member.json carries over from PREPARE's payload (the rest of the runner's input is the capsule).
MEMBER_FIELDS = (
    "member_id",
    "attempt_id",
    "attempt",
    "job_id",
    "rank",
    "world_size",
    "gpu_indices",
    "cpus",
    "memory_bytes",
    "capsule_digest",
    "master_addr",
    "master_port",
    "shared_path",
)


class PrepareFailed(Exception):
    """A prepare step failed; the message is the reason reported with member_prepare_failed."""


@dataclass(frozen=True)
class NodeAccess:
    """How this agent reaches the gateway's HTTP side as its node."""

    server: str
    http: aiohttp.ClientSession
    credential: Callable[[], str]
    ca_bundle: str | None = None


async def fetch_capsule(access: NodeAccess, cache: Path, digest: str) -> Path:
    """The capsule tar in the agent's cache, fetched once per digest (unpack_capsule verifies it again)."""
    cache.mkdir(parents=True, exist_ok=True)
    target = cache / f"{digest}.tar"
    if target.is_file():
        return target
    url = access.server.rstrip("/") + protocol.FILES_PATH + f"capsule/{digest}"
    partial = cache / f"{digest}.{os.getpid()}.{id(asyncio.current_task())}.partial"
    hasher = hashlib.sha256()
    try:
        async with access.http.get(
            url,
            headers={"Authorization": f"Bearer {access.credential()}"},
            timeout=aiohttp.ClientTimeout(total=None, sock_read=120),
        ) as response:
            if response.status != 200:
                try:
                    message = (await response.json(content_type=None)).get("error")
                except ValueError:
                    message = None
                raise PrepareFailed(
                    f"fetching capsule {digest} failed: {message or f'HTTP {response.status}'}"
                )
            with open(partial, "wb") as handle:
                async for block in response.content.iter_chunked(1024 * 1024):
                    hasher.update(block)
                    handle.write(block)
    except aiohttp.ClientError as exc:
        partial.unlink(missing_ok=True)
        raise PrepareFailed(f"fetching capsule {digest} failed: {exc}") from exc
    if hasher.hexdigest() != digest:
        partial.unlink(missing_ok=True)
        raise PrepareFailed(f"capsule digest mismatch: fetched {hasher.hexdigest()}, expected {digest}")
    os.replace(partial, target)
    return target


def unpack_source(spec: dict, directory: Path) -> None:
    """The source archive into <member>/src (once); tarfile's data filter refuses what leaves the tree."""
    if (spec.get("input") or {}).get("kind") != "source":
        return
    src = directory / "src"
    if (src / ".tuneplane-unpacked").is_file():
        return
    if src.exists():
        shutil.rmtree(src)
    partial = directory / "src.partial"
    if partial.exists():
        shutil.rmtree(partial)
    partial.mkdir()
    try:
        with tarfile.open(directory / "capsule" / "source" / "archive.tar.gz", "r:gz") as tar:
            tar.extractall(partial, filter="data")
    except (tarfile.TarError, OSError) as exc:
        raise PrepareFailed(f"cannot unpack the source archive: {exc}") from exc
    (partial / ".tuneplane-unpacked").write_text("")
    os.replace(partial, src)


def materialize(access: NodeAccess, inputs: list[dict], root: Path) -> None:
    from workers.artifacts.deliver import node_http
    from workers.artifacts.materialize import MaterializeError, materialize_inputs

    root.mkdir(parents=True, exist_ok=True)
    try:
        with node_http(access.server, access.credential(), ca_bundle=access.ca_bundle) as http:
            materialize_inputs(http, inputs, root)
    except MaterializeError as exc:
        raise PrepareFailed(str(exc)) from exc


async def pull_image(runtime: str, image: str) -> None:
    """A cold image is pulled here, in a subprocess (the event loop goes on meanwhile)."""
    check = await asyncio.create_subprocess_exec(
        runtime,
        "image",
        "inspect",
        image,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.DEVNULL,
    )
    if await check.wait() == 0:
        return
    pull = await asyncio.create_subprocess_exec(
        runtime, "pull", image, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT
    )
    output, _ = await pull.communicate()
    if pull.returncode != 0:
        last = output.decode(errors="replace").strip().splitlines()[-1:] or [""]
        raise PrepareFailed(f"cannot pull image {image}: {last[0][:200]}")


async def prepare_member_dir(
    access: NodeAccess,
    work_dir: Path,
    directory: Path,
    payload: dict,
    node: str | None,
    checks: dict,
    *,
    simulated_gpus: bool = False,
) -> None:
    """Everything PREPARE does for one member; fills `checks` (peer_check, storage_check) as it goes."""
    digest = str(payload["capsule_digest"])
    capsule_dir = directory / "capsule"
    if not (capsule_dir / "manifest.json").is_file():
        tar_path = await fetch_capsule(access, work_dir / "capsules", digest)
        await asyncio.to_thread(unpack_capsule, tar_path, digest, capsule_dir)
    spec = json.loads((capsule_dir / "spec.json").read_text())
    await asyncio.to_thread(unpack_source, spec, directory)
    if spec.get("inputs"):
        await asyncio.to_thread(materialize, access, spec["inputs"], directory / "input")
    pin = spec.get("runtime") or {}
    runtime = await asyncio.to_thread(check_runtime, pin)
    if runtime is not None and pin.get("image"):
        await pull_image(runtime, str(pin["image"]))
    checks["peer_check"] = await peer_check(
        int(payload["rank"]), payload.get("peers") or [], payload.get("master_port")
    )
    storage = await asyncio.to_thread(
        storage_check, payload.get("shared_path"), f"{node or 'node'}-{payload['member_id']}"
    )
    if storage is not None:
        checks["storage_check"] = storage
    problems = [c["error"] for c in checks.values() if c and not c.get("ok")]
    if problems:
        raise PrepareFailed("; ".join(problems))
    member: dict[str, Any] = {key: payload.get(key) for key in MEMBER_FIELDS}
    member.update(local_rank=0, node_rank=payload.get("rank"), simulated_gpus=simulated_gpus, node=node)
    (directory / "output").mkdir(exist_ok=True)
    (directory / "logs").mkdir(exist_ok=True)
    tmp = directory / "member.json.tmp"
    tmp.write_text(json.dumps(member, indent=2))
    os.replace(tmp, directory / "member.json")
