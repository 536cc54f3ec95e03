"""The steps of PREPARE on the node, run by the launch handlers as one asyncio task per member.

Blocking work runs in threads and a cold image pull in a subprocess, so a long preparation never stalls
the agent's event loop (heartbeats, other members). Every failure raises with the reason the job shows.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp

from tuneplane.app.client.transport import retry_after
from tuneplane.app.node_gateway import protocol
from tuneplane.workers.agent.environments import EnvironmentBuildFailed, Progress, prepare_environment
from tuneplane.workers.agent.images import ImagePrepareFailed, prepare_image
from tuneplane.workers.agent.probe import check_peers, storage_check
from tuneplane.workers.capsule import file_digest, unpack_capsule
from tuneplane.workers.member_setup import MEMBER_FIELDS, PrepareFailed, unpack_source
from tuneplane.workers.runner.runtime import check_runtime


@dataclass(frozen=True)
class NodeAccess:
    """How this agent reaches the gateway's HTTP side as its node."""

    server: str
    http: aiohttp.ClientSession
    credential: Callable[[], str]
    ca_bundle: str | None = None


# A capsule fetch that meets a connection error or a 5xx (the node gateway restarting, a proxy in between)
# is tried again, resuming from the bytes already received, after these pauses (doubling up to the last),
# for as long as the prepare deadline allows (FETCH_BUDGET seconds when PREPARE carried none).
FETCH_PAUSE_FIRST = 0.2
FETCH_PAUSE_MAX = 5.0
FETCH_BUDGET = 120.0
FETCH_BLOCK = 1024 * 1024


class _FetchInterrupted(Exception):
    """This try failed for a reason that another try may not meet (connection, 5xx, stalled read); a 503
    says when to try again (`retry_after`: the gateway's database is away, a failover)."""

    def __init__(self, message: str, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after


async def fetch_capsule(access: NodeAccess, cache: Path, digest: str, deadline: float | None = None) -> Path:
    """The capsule tar in the agent's cache, fetched once per digest (unpack_capsule verifies it again).

    A try interrupted by the gateway going away (connection refused or reset, a read that stalls, a 5xx) is
    followed by another that asks only for the rest (`Range: bytes=<received>-`; a server that answers 200
    instead restarts the file), until `deadline` (time.time() seconds: PREPARE's deadline). A refusal (4xx)
    is final. The whole file is checked against `digest` at the end."""
    cache.mkdir(parents=True, exist_ok=True)
    target = cache / f"{digest}.tar"
    if target.is_file():
        return target
    url = access.server.rstrip("/") + protocol.FILES_PATH + f"capsule/{digest}"
    partial = cache / f"{digest}.{os.getpid()}.{id(asyncio.current_task())}.partial"
    partial.unlink(missing_ok=True)
    give_up_at = deadline if deadline is not None else time.time() + FETCH_BUDGET
    pause = FETCH_PAUSE_FIRST
    tries = 0
    try:
        while True:
            tries += 1
            try:
                await _fetch_rest(access, url, partial, digest)
                break
            except _FetchInterrupted as exc:
                wait = max(pause, exc.retry_after or 0.0)
                if time.time() + wait >= give_up_at:
                    raise PrepareFailed(
                        f"fetching capsule {digest} failed after {tries} tries until the prepare "
                        f"deadline: {exc}"
                    ) from exc
                await asyncio.sleep(wait)
                pause = min(pause * 2, FETCH_PAUSE_MAX)
        actual = await asyncio.to_thread(file_digest, partial)
        if actual != digest:
            raise PrepareFailed(f"capsule digest mismatch: fetched {actual}, expected {digest}")
        os.replace(partial, target)
    except BaseException:
        # Whatever ended the fetch (a refusal, the deadline, a full disk, an ABORT cancelling the prepare),
        # its partial file goes: left behind, each would keep its bytes on the node's disk for ever.
        partial.unlink(missing_ok=True)
        raise
    return target


async def _fetch_rest(
    access: NodeAccess, url: str, partial: Path, digest: str, *, store: bool = False
) -> None:
    """One try: append what the server sends after the bytes already in `partial`. An S3 fleet's capsule
    is answered with a redirect to a presigned GET in its store: followed once, without the node's
    credential (`store`), plain HTTP only to loopback as for the gateway."""
    have = partial.stat().st_size if partial.exists() else 0
    headers = {} if store else {"Authorization": f"Bearer {access.credential()}"}
    if have:
        headers["Range"] = f"bytes={have}-"
    try:
        async with access.http.get(
            url, headers=headers, allow_redirects=False,
            timeout=aiohttp.ClientTimeout(total=None, connect=10, sock_read=30),
        ) as response:  # fmt: skip
            if response.status == 307 and not store and response.headers.get("Location"):
                location = response.headers["Location"]
                _check_store_url(location, digest)
                return await _fetch_rest(access, location, partial, digest, store=True)
            if response.status == 416 and have:
                return  # nothing after what we have: the whole file is here (the digest check decides)
            source = "the object store" if store else "the node gateway"
            if response.status >= 500:
                raise _FetchInterrupted(
                    f"HTTP {response.status} from {source}",
                    retry_after(response.status, response.headers.get("Retry-After")),
                )
            if response.status not in (200, 206):
                try:
                    message = (await response.json(content_type=None)).get("error")
                except (ValueError, aiohttp.ClientError):
                    message = None
                why = message or f"HTTP {response.status}"
                raise PrepareFailed(f"fetching capsule {digest} failed: {why}")
            with open(partial, "ab" if response.status == 206 else "wb") as handle:
                async for block in response.content.iter_chunked(FETCH_BLOCK):
                    handle.write(block)
    except (aiohttp.ClientError, TimeoutError, ConnectionError) as exc:
        raise _FetchInterrupted(f"{type(exc).__name__}: {exc}") from exc


def _check_store_url(url: str, digest: str) -> None:
    from tuneplane.app.client.transport import ClientError, check_transport

    try:
        check_transport(url)
    except ClientError as exc:
        raise PrepareFailed(f"fetching capsule {digest} from the object store: {exc}") from exc


def materialize(access: NodeAccess, inputs: list[dict], root: Path, resume: dict | None = None) -> None:
    """The job's pinned inputs under `root` (input/) and the checkpoint this attempt resumes from in
    `<member dir>/resume` (PREPARE's `resume`, docs/preemption.md), each verified against its manifest."""
    from tuneplane.workers.artifacts.deliver import node_http
    from tuneplane.workers.artifacts.materialize import (
        MaterializeError,
        materialize_input,
        materialize_inputs,
    )

    root.mkdir(parents=True, exist_ok=True)
    try:
        with node_http(access.server, access.credential(), ca_bundle=access.ca_bundle) as http:
            materialize_inputs(http, inputs, root)
            if resume:
                pinned = {**resume, "name": f"resume ({resume['name']})"}
                materialize_input(http, pinned, root.parent / "resume")
    except MaterializeError as exc:
        raise PrepareFailed(str(exc)) from exc


async def _no_progress(_step: str, _detail: dict) -> None:
    return None


def node_checks(payload: dict, node: str | None) -> dict:
    """What PREPARE checks of this node's surroundings (probe.py): its peers reachable, rank 0's MASTER_PORT
    free, the fleet's shared path writable. Blocking (a thread's work)."""
    peers = check_peers(int(payload["rank"]), payload.get("peers") or [], payload.get("master_port"))
    checks = {"peer_check": peers}
    storage = storage_check(payload.get("shared_path"), f"{node or 'node'}-{payload['member_id']}")
    if storage is not None:
        checks["storage_check"] = storage
    return checks


def unpack_member(
    access: NodeAccess, tar_path: Path | None, digest: str, directory: Path, payload: dict
) -> tuple[dict, str | None]:
    """(spec, container runtime) once the member directory holds its capsule (from `tar_path`, unless it is
    unpacked already), its source and its inputs, and the pinned runtime is checked. Blocking: one thread
    hop for all of it (on a node busy starting a gang, each hop waits its turn for a CPU)."""
    if tar_path is not None:
        unpack_capsule(tar_path, digest, directory / "capsule")
    spec = json.loads((directory / "capsule" / "spec.json").read_text())
    unpack_source(spec, directory)
    if spec.get("inputs") or payload.get("resume"):
        materialize(access, spec.get("inputs") or [], directory / "input", payload.get("resume"))
    return spec, check_runtime(spec.get("runtime") or {})


async def prepare_member_dir(
    access: NodeAccess,
    work_dir: Path,
    directory: Path,
    payload: dict,
    node: str | None,
    checks: dict,
    *,
    simulated_gpus: bool = False,
    progress: Progress | None = None,
) -> None:
    """Everything PREPARE does for one member; fills `checks` (peer_check, storage_check) once every local
    step passed; `progress` gets the environment build's steps (workers/agent/environments.py). The blocking
    steps take two thread hops (unpack_member, node_checks), not one each: on a node busy starting a gang,
    every hop waits its turn for a CPU."""
    digest = str(payload["capsule_digest"])
    tar_path = None
    if not (directory / "capsule" / "manifest.json").is_file():
        deadline = float(payload["deadline"]) if payload.get("deadline") is not None else None
        tar_path = await fetch_capsule(access, work_dir / "capsules", digest, deadline)
    spec, runtime = await asyncio.to_thread(unpack_member, access, tar_path, digest, directory, payload)
    pin = spec.get("runtime") or {}
    if runtime is not None and pin.get("image"):
        try:
            await prepare_image(runtime, pin, progress or _no_progress)
        except ImagePrepareFailed as exc:
            raise PrepareFailed(str(exc)) from exc
    try:
        environment = await prepare_environment(work_dir, spec, progress)
    except EnvironmentBuildFailed as exc:
        raise PrepareFailed(
            f"environment {str(pin['environment']['digest'])[:12]} cannot be built: {exc}"
        ) from exc
    checks.update(await asyncio.to_thread(node_checks, payload, node))
    problems = [c["error"] for c in checks.values() if c and not c.get("ok")]
    if problems:
        raise PrepareFailed("; ".join(problems))
    member: dict[str, Any] = {key: payload.get(key) for key in MEMBER_FIELDS}
    member.update(local_rank=0, node_rank=payload.get("rank"), simulated_gpus=simulated_gpus, node=node)
    member["environment"] = environment
    (directory / "output").mkdir(exist_ok=True)
    (directory / "logs").mkdir(exist_ok=True)
    tmp = directory / "member.json.tmp"
    tmp.write_text(json.dumps(member, indent=2))
    os.replace(tmp, directory / "member.json")
