"""A small capsule travels inside its PREPARE (issue 23): the node gateway adds it at delivery, never to the
stored command, and the agent uses it only when it is the capsule PREPARE names. A real gateway on loopback,
a real control session and the real blob store; the agent's PREPARE handler is replaced by a recorder for
the delivery test."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import os
import time
from pathlib import Path

import aiohttp
import pytest
from aiohttp.test_utils import TestServer
from psycopg.types.json import Jsonb

from tests.node_helpers import fast_thresholds, make_fleet, make_token, simulated_capacity
from tuneplane.app.blobstore import FilesystemBlobStore
from tuneplane.app.db import Database
from tuneplane.app.node_gateway import protocol
from tuneplane.app.node_gateway.aiodb import AsyncDatabase
from tuneplane.app.node_gateway.launch import as_delivered
from tuneplane.app.node_gateway.server import Gateway
from tuneplane.workers.agent.credential import MemoryCredentialStore
from tuneplane.workers.agent.handlers import COMMAND_HANDLERS, AgentContext
from tuneplane.workers.agent.prepare import NodeAccess, PrepareFailed, fetch_capsule
from tuneplane.workers.agent.session import ControlSession, enroll


def _blob(blob_dir: Path, data: bytes) -> str:
    blobs = FilesystemBlobStore(blob_dir)
    digest = hashlib.sha256(data).hexdigest()
    with blobs.stage() as (staged, handle):
        handle.write(data)
        handle.flush()
        blobs.commit_staged(staged, digest)
    return digest


def test_only_a_small_capsule_that_is_in_the_store_goes_with_its_prepare(tmp_path: Path) -> None:
    small = _blob(tmp_path, b"capsule bytes")
    large = _blob(tmp_path, os.urandom(protocol.CAPSULE_INLINE_MAX + 1))
    payload = {"member_id": 1, "capsule_digest": small}
    carried = as_delivered("prepare", payload, tmp_path)
    assert base64.b64decode(carried[protocol.CAPSULE_INLINE]) == b"capsule bytes"
    assert protocol.CAPSULE_INLINE not in payload  # the stored command's payload is not changed
    for kind, body, blob_dir in (
        ("prepare", {"capsule_digest": large}, tmp_path),  # too large: fetched
        ("prepare", {"capsule_digest": "0" * 64}, tmp_path),  # not in the store: the fetch says why
        ("prepare", {"capsule_digest": "../etc"}, tmp_path),  # not a digest
        ("prepare", {"capsule_digest": small}, None),  # a gateway without a blob store
        ("start", {"capsule_digest": small}, tmp_path),  # other commands carry none
    ):
        assert as_delivered(kind, body, blob_dir) == body


def test_the_gateway_delivers_a_prepare_with_its_capsule_and_stores_the_command_without_it(
    db_url: str, db: Database, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fast_thresholds(db, heartbeat=0.2, stale=2, lost=4)
    make_fleet(db)
    token = make_token(db)
    digest = _blob(tmp_path / "blobs", b"a small capsule")
    seen: list[dict] = []

    async def recorder(_ctx: AgentContext, payload: dict) -> dict:
        seen.append(payload)
        return {"state": "preparing"}

    monkeypatch.setitem(COMMAND_HANDLERS, "prepare", recorder)

    async def scenario() -> None:
        gateway = Gateway(AsyncDatabase(db_url, max_size=4), name="gw", blob_dir=tmp_path / "blobs")
        server = TestServer(gateway.make_app(), host="127.0.0.1")
        await server.start_server()
        url = f"http://127.0.0.1:{server.port}"
        try:
            async with aiohttp.ClientSession() as http:
                store = MemoryCredentialStore(await enroll(http, url, token, "n1"))
                session = ControlSession(
                    http, url, store, AgentContext(), simulated_capacity, say=lambda _m: None
                )
                task = asyncio.create_task(session.run())
                await asyncio.wait_for(session.connected.wait(), 10)
                await session.report("reconcile", {"running": [], "exited": []})
                body = Jsonb({"member_id": 7, "capsule_digest": digest})
                await asyncio.to_thread(
                    db.call, "enqueue_node_command", session.ctx.node_id, "prepare", body, "t"
                )
                deadline = time.monotonic() + 10
                while not seen and time.monotonic() < deadline:
                    await asyncio.sleep(0.02)
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
        finally:
            await server.close()

    asyncio.run(scenario())
    assert len(seen) == 1 and base64.b64decode(seen[0][protocol.CAPSULE_INLINE]) == b"a small capsule"
    stored = db.fetch_one("SELECT payload FROM node_commands WHERE kind = 'prepare'")["payload"]
    assert stored == {"member_id": 7, "capsule_digest": digest}


def test_the_agent_uses_a_carried_capsule_only_when_it_is_the_one_named(tmp_path: Path) -> None:
    data = b"the capsule's tar"
    digest = hashlib.sha256(data).hexdigest()

    async def fetch(inline: object, cache: Path) -> Path:
        async with aiohttp.ClientSession() as http:
            # Nothing listens there: a fetch can only fail (at the deadline, 1.5 s from now).
            access = NodeAccess("http://127.0.0.1:9", http, lambda: "tpn_none")
            return await fetch_capsule(access, cache, digest, time.time() + 1.5, inline)

    carried = asyncio.run(fetch(base64.b64encode(data).decode(), tmp_path / "a"))
    assert carried == tmp_path / "a" / f"{digest}.tar" and carried.read_bytes() == data
    assert not list((tmp_path / "a").glob("*.partial"))
    for name, wrong in (("b", base64.b64encode(b"other bytes").decode()), ("c", "not base64!"), ("d", 42)):
        with pytest.raises(PrepareFailed, match="until the prepare deadline"):
            asyncio.run(fetch(wrong, tmp_path / name))  # fetched instead, and the fetch failed
        assert not (tmp_path / name / f"{digest}.tar").exists()
