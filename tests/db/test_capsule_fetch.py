"""The agent's capsule fetch survives the node gateway being killed mid-download: it tries again within
the prepare deadline and resumes from the bytes it has (real gateways on loopback, real node credential,
real database). Between agent and gateway sits a TCP relay that plays the network (a fault injector, named
so): it cuts every connection after a number of bytes, refuses service while no gateway runs, and then
forwards to the restarted gateway."""

from __future__ import annotations

import asyncio
import hashlib
import os
import re
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import aiohttp
import pytest
from aiohttp.test_utils import TestServer

from tests.launch_fixtures import make_job, make_user
from tests.node_helpers import enroll, make_fleet, make_token
from tuneplane.app.blobstore import FilesystemBlobStore
from tuneplane.app.db import Database
from tuneplane.app.node_gateway.aiodb import AsyncDatabase
from tuneplane.app.node_gateway.server import Gateway
from tuneplane.workers.agent.prepare import NodeAccess, PrepareFailed, fetch_capsule


class CuttingRelay:
    """TCP relay (fault injector): forwards to `upstream_port`; cuts the connection once `cut_after` bytes
    came back from upstream (then never again); closes connections at once while `upstream_port` is None."""

    def __init__(self, cut_after: int) -> None:
        self.cut_after = cut_after
        self.cut_done = asyncio.Event()
        self.upstream_port: int | None = None
        self.requests: list[bytes] = []
        self.server: asyncio.Server | None = None

    async def start(self) -> int:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return self.server.sockets[0].getsockname()[1]

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.upstream_port is None:
            writer.transport.abort()  # like a host with nothing listening behind it
            return
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.upstream_port)
        head = await reader.read(65536)
        self.requests.append(head)
        up_writer.write(head)

        async def upstream_to_client() -> None:
            sent = 0
            while block := await up_reader.read(65536):
                if not self.cut_done.is_set() and sent + len(block) > self.cut_after:
                    writer.write(block[: self.cut_after - sent])
                    await writer.drain()
                    self.cut_done.set()
                    writer.transport.abort()
                    up_writer.transport.abort()
                    return
                sent += len(block)
                writer.write(block)
                await writer.drain()
            writer.close()

        async def client_to_upstream() -> None:
            while block := await reader.read(65536):
                up_writer.write(block)
                await up_writer.drain()

        await asyncio.gather(upstream_to_client(), client_to_upstream(), return_exceptions=True)

    async def close(self) -> None:
        assert self.server is not None
        self.server.close()


@pytest.fixture
def capsule(db: Database, tmp_path: Path) -> dict:
    """A 6 MiB capsule blob in the store and a member of this node's that uses it."""
    fleet = make_fleet(db)
    _node, credential = enroll(db, make_token(db), "n0")
    db.fetch_all("UPDATE nodes SET cpus = 8, memory_bytes = 2^34, last_heartbeat_at = now() RETURNING 1")
    blobs = FilesystemBlobStore(tmp_path / "blobs")
    data = os.urandom(6 * 1024 * 1024)
    digest = hashlib.sha256(data).hexdigest()
    with blobs.stage() as (staged, handle):
        handle.write(data)
        handle.flush()
        blobs.commit_staged(staged, digest)
    make_job(db, make_user(db), fleet["id"], gpus_per_node=0)
    (placed,) = db.call("reserve_next", fleet["id"], 1000)
    epoch = db.call("claim_launch", placed["attempt_id"], "w")[0]["epoch"]
    db.call("begin_prepare", placed["attempt_id"], epoch, digest)
    return {"digest": digest, "credential": credential, "size": len(data)}


async def _gateway(db_url: str, tmp_path: Path) -> TestServer:
    gateway = Gateway(AsyncDatabase(db_url, max_size=2), name="gw", blob_dir=tmp_path / "blobs")
    server = TestServer(gateway.make_app(), host="127.0.0.1")
    await server.start_server()
    return server


@asynccontextmanager
async def _fetch_cut_off(
    db_url: str, tmp_path: Path, capsule: dict, cut_after: int, deadline_in: float
) -> AsyncIterator[tuple[CuttingRelay, asyncio.Task]]:
    """A fetch through the relay whose gateway was just killed mid-download (the relay forwards nowhere)."""
    relay = CuttingRelay(cut_after)
    port = await relay.start()
    first = await _gateway(db_url, tmp_path)
    relay.upstream_port = first.port
    try:
        async with aiohttp.ClientSession() as http:
            access = NodeAccess(f"http://127.0.0.1:{port}", http, lambda: capsule["credential"])
            fetch = asyncio.create_task(
                fetch_capsule(access, tmp_path / "cache", capsule["digest"], time.time() + deadline_in)
            )
            await asyncio.wait_for(relay.cut_done.wait(), 30)
            relay.upstream_port = None
            await first.close()
            yield relay, fetch
    finally:
        await relay.close()


def test_a_gateway_killed_mid_download_is_retried_and_the_fetch_resumes(
    db_url: str, capsule: dict, tmp_path: Path
) -> None:
    async def scenario() -> tuple[Path, CuttingRelay]:
        async with _fetch_cut_off(db_url, tmp_path, capsule, 2 * 1024 * 1024, 60) as (relay, fetch):
            await asyncio.sleep(0.5)  # for a while nothing answers; then a new gateway runs
            second = await _gateway(db_url, tmp_path)
            relay.upstream_port = second.port
            try:
                return await asyncio.wait_for(fetch, 60), relay
            finally:
                await second.close()

    path, relay = asyncio.run(scenario())
    assert hashlib.sha256(path.read_bytes()).hexdigest() == capsule["digest"]
    assert path.stat().st_size == capsule["size"]
    # The try after the restart asked only for the rest.
    resumed = [re.search(rb"range: bytes=(\d+)-", r.lower()) for r in relay.requests]
    offsets = [int(m.group(1)) for m in resumed if m]
    # The relay cut after 2 MiB of response (headers included): the rest was asked from just below that.
    assert offsets and 2 * 1024 * 1024 - 4096 < offsets[-1] < 2 * 1024 * 1024, offsets


def test_a_gateway_that_stays_away_fails_the_fetch_at_the_prepare_deadline(
    db_url: str, capsule: dict, tmp_path: Path
) -> None:
    async def scenario() -> PrepareFailed:
        async with _fetch_cut_off(db_url, tmp_path, capsule, 1024 * 1024, 2.0) as (_relay, fetch):
            with pytest.raises(PrepareFailed) as failed:
                await asyncio.wait_for(fetch, 30)
            return failed.value

    failure = asyncio.run(scenario())
    assert "until the prepare deadline" in str(failure) and "tries" in str(failure)
    assert not list((tmp_path / "cache").glob("*.partial"))
