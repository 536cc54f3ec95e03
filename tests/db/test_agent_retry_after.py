"""The node agent honours the node gateway's 503 + Retry-After while the gateway's database is away (a
restart, a failover: issue 33). Real parts on loopback: the node gateway, the agent's own connect and
enrollment loops (run_agent), a real PostgreSQL behind a TCP relay that plays the database going away (a
fault injector, named so: every connection through it is cut and new ones are refused until it is back).

The agents' own backoff is capped at 0.05 s here, so a pause of Retry-After (2 s) or more can only come from
the header; once the database is back both agents connect.
"""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import aiohttp
import psycopg
from aiohttp.test_utils import TestServer
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from tests.node_helpers import enroll, make_fleet, make_token
from tuneplane.app import reconnect
from tuneplane.app.db import Database
from tuneplane.app.node_gateway.aiodb import AsyncDatabase
from tuneplane.app.node_gateway.server import Gateway
from tuneplane.workers.agent.credential import FileCredentialStore, StoredCredential
from tuneplane.workers.agent.main import AgentOptions, run_agent

DEADLINE_S = 60.0  # bounded waits; the limit only stops a hung test


class DatabaseRelay:
    """TCP relay in front of PostgreSQL (fault injector): `away()` cuts every relayed connection and
    refuses new ones, like a primary that died; `back()` forwards again."""

    def __init__(self, host: str, port: int) -> None:
        self.upstream = (host, port)
        self.is_away = False
        self.transports: set[asyncio.Transport] = set()
        self.server: asyncio.Server | None = None

    async def start(self) -> int:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return self.server.sockets[0].getsockname()[1]

    def away(self) -> None:
        self.is_away = True
        for transport in list(self.transports):
            transport.abort()

    def back(self) -> None:
        self.is_away = False

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.is_away:
            writer.transport.abort()
            return
        host, port = self.upstream
        if host.startswith("/"):  # the test server listens on a Unix socket in that directory
            up_reader, up_writer = await asyncio.open_unix_connection(f"{host}/.s.PGSQL.{port}")
        else:
            up_reader, up_writer = await asyncio.open_connection(host, port)
        pair = {writer.transport, up_writer.transport}
        self.transports |= pair

        async def pump(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
            while block := await source.read(65536):
                sink.write(block)
                await sink.drain()

        try:
            await asyncio.gather(pump(reader, up_writer), pump(up_reader, writer), return_exceptions=True)
        finally:
            self.transports -= pair
            for transport in pair:
                transport.abort()

    async def close(self) -> None:
        assert self.server is not None
        self.server.close()
        self.away()


def _pauses(lines: list[str], what: str) -> list[float]:
    """The pauses an agent announced after a failed try (`… retrying in 2.1s` / `reconnecting in 2.1s`)."""
    found = (re.search(r"in (\d+\.\d+)s", line) for line in lines if what in line)
    return [float(m.group(1)) for m in found if m]


async def _until(predicate, what: str) -> None:
    deadline = asyncio.get_running_loop().time() + DEADLINE_S
    while not predicate():
        assert asyncio.get_running_loop().time() < deadline, what
        await asyncio.sleep(0.05)


def test_agents_wait_out_503_retry_after_while_the_gateways_database_is_away(
    db: Database, db_url: str, tmp_path: Path
) -> None:
    make_fleet(db)
    node, credential = enroll(db, make_token(db), "a")
    token = make_token(db)

    async def scenario() -> tuple[list[str], list[str], aiohttp.ClientResponse | None]:
        params = conninfo_to_dict(db_url)
        relay = DatabaseRelay(str(params["host"]), int(params["port"]))
        relayed = make_conninfo(db_url, host="127.0.0.1", port=await relay.start())
        gateway = Gateway(AsyncDatabase(relayed, max_size=2), name="gw", blob_dir=tmp_path / "blobs")
        server = TestServer(gateway.make_app(), host="127.0.0.1")
        await server.start_server()
        # A request waits this long for a connection before it is answered 503 (30 s in production).
        gateway.db.pool.timeout = 1.0
        url = f"http://127.0.0.1:{server.port}"
        state_a = tmp_path / "a" / "state"
        state_a.mkdir(parents=True)
        FileCredentialStore(state_a / "node-credential.json").save(
            StoredCredential(node_id=node["node_id"], node="a", fleet="gpu", credential=credential)
        )
        said_a: list[str] = []
        said_b: list[str] = []

        def options(name: str, **extra: object) -> AgentOptions:
            return AgentOptions(
                server=url, state_dir=str(tmp_path / name / "state"), work_dir=str(tmp_path / name / "work"),
                name=name, max_backoff=0.05, simulate_gpus=0, standby_runners=0, **extra,
            )  # fmt: skip

        relay.away()
        agents = [
            asyncio.create_task(run_agent(options("a"), say=said_a.append)),
            asyncio.create_task(run_agent(options("b", enroll_token=token), say=said_b.append)),
        ]
        plain = None
        try:
            # Two refused tries each: the control handshake (agent a) and the enrollment (agent b).
            await _until(lambda: len(_pauses(said_a, "disconnected")) >= 2, f"agent a: {said_a}")
            await _until(lambda: len(_pauses(said_b, "to enroll")) >= 2, f"agent b: {said_b}")
            async with (
                aiohttp.ClientSession() as http,
                http.get(
                    f"{url}/v1/files/capsule/{'0' * 64}", headers={"Authorization": f"Bearer {credential}"}
                ) as plain,
            ):
                await plain.read()
            relay.back()
            for said in (said_a, said_b):
                await _until(lambda s=said: any(line.startswith("connected to") for line in s), str(said))
        finally:
            for agent in agents:
                agent.cancel()
            await asyncio.gather(*agents, return_exceptions=True)
            await server.close()
            await relay.close()
        return said_a, said_b, plain

    said_a, said_b, plain = asyncio.run(scenario())
    assert plain is not None and plain.status == 503
    assert plain.headers["Retry-After"] == str(reconnect.RETRY_AFTER_S)
    # Every pause during the outage is the Retry-After's (or a little more), never the 0.05 s backoff.
    for pauses in (_pauses(said_a, "disconnected"), _pauses(said_b, "to enroll")):
        assert pauses and min(pauses) >= reconnect.RETRY_AFTER_S, pauses
    assert any("503" in line for line in said_a), said_a
    with psycopg.connect(db_url) as conn:
        assert conn.execute("SELECT count(*) FROM tuneplane.nodes").fetchone()[0] == 2  # b enrolled
