"""The agent's log shipper against a real node gateway (aiohttp on loopback) and a real control session:
real files written while it tails them, a reconnect in the middle, a restart from offset 0."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import aiohttp
from aiohttp.test_utils import TestServer

from tests.launch_fixtures import make_job, make_node, make_user
from tests.node_helpers import fast_thresholds, make_fleet, make_token, simulated_capacity
from tuneplane.app.db import Database
from tuneplane.app.node_gateway.aiodb import AsyncDatabase
from tuneplane.app.node_gateway.server import Gateway
from tuneplane.workers.agent.credential import MemoryCredentialStore
from tuneplane.workers.agent.directories import AgentPaths
from tuneplane.workers.agent.handlers import AgentContext
from tuneplane.workers.agent.logship import ship_logs, utf8_cut
from tuneplane.workers.agent.session import ControlSession, enroll


@asynccontextmanager
async def running_gateway(db_url: str) -> AsyncIterator[str]:
    gateway = Gateway(AsyncDatabase(db_url, max_size=4), name="test-gw", poll_interval=0.5)
    server = TestServer(gateway.make_app(), host="127.0.0.1")
    await server.start_server()
    try:
        yield f"http://127.0.0.1:{server.port}"
    finally:
        await server.close()


async def until(predicate: Callable[[], object], timeout: float = 15.0) -> object:
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        value = await asyncio.to_thread(predicate)
        if value:
            return value
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"timed out after {timeout}s")
        await asyncio.sleep(0.05)


def stored_text(db: Database, member_id: int, stream: str = "stdout") -> str:
    rows = db.fetch_all(
        "SELECT text FROM member_log_chunks WHERE member_id = %s AND stream = %s ORDER BY start_offset",
        (member_id, stream),
    )
    return "".join(r["text"] for r in rows)


class Agent:
    """One enrolled node with a control session that can be dropped and opened again."""

    def __init__(self, http: aiohttp.ClientSession, url: str, tmp: Path) -> None:
        self.http, self.url = http, url
        self.store = MemoryCredentialStore()
        self.ctx = AgentContext(paths=AgentPaths.prepare(tmp / "state"))
        self.task: asyncio.Task | None = None

    async def connect(self) -> None:
        session = ControlSession(
            self.http, self.url, self.store, self.ctx, simulated_capacity, say=lambda _m: None
        )
        self.task = asyncio.create_task(session.run())
        await asyncio.wait_for(session.connected.wait(), 15)

    async def drop(self) -> None:
        assert self.task is not None
        self.task.cancel()
        await asyncio.gather(self.task, return_exceptions=True)


def _member_on_node(db: Database, node_id: int, gpus: int = 1) -> int:
    """A job reserved on the given node (placement is the real stored function)."""
    fleet_id = db.fetch_one("SELECT fleet_id FROM nodes WHERE id = %s", (node_id,))["fleet_id"]
    user = db.fetch_one("SELECT id FROM users WHERE username = 'alice'") or {"id": make_user(db)}
    job_id = make_job(db, user["id"], fleet_id, gpus_per_node=gpus)
    db.call("reserve_next", fleet_id, 10)
    member = db.fetch_one("SELECT id, node_id FROM members WHERE job_id = %s", (job_id,))
    assert member["node_id"] == node_id
    return member["id"]


def test_shipper_follows_growing_files_across_a_reconnect_and_a_restart(
    db_url: str, db: Database, tmp_path: Path
) -> None:
    fast_thresholds(db, heartbeat=0.2, stale=5, lost=10)
    make_fleet(db)
    token = make_token(db)
    logs = tmp_path / "work" / "members" / "1" / "logs"
    logs.mkdir(parents=True)
    stdout, stderr = logs / "stdout.log", logs / "stderr.log"

    async def scenario() -> None:
        async with running_gateway(db_url) as url, aiohttp.ClientSession() as http:
            agent = Agent(http, url, tmp_path)
            agent.store.save(await enroll(http, url, token, "n1"))
            await agent.connect()
            node_id = agent.ctx.node_id
            await until(lambda: db.fetch_one("SELECT cpus FROM nodes WHERE id = %s", (node_id,))["cpus"] > 0)
            member_id = await asyncio.to_thread(_member_on_node, db, node_id)

            stop = asyncio.Event()
            shipper = asyncio.create_task(ship_logs(agent.ctx, member_id, logs, stop, interval=0.05))
            euro = "€".encode()
            with open(stdout, "ab") as out:
                out.write(b"step 1\nprice " + euro[:1])  # a character split across two writes
                out.flush()
                await until(lambda: stored_text(db, member_id) == "step 1\nprice ")
                out.write(euro[1:] + b"\n")
                out.flush()
                await until(lambda: stored_text(db, member_id) == "step 1\nprice €\n")

                await agent.drop()  # the control connection is lost while the workload keeps writing
                out.write(b"written while disconnected\n")
                out.flush()
                stderr.write_bytes(b"warning\x00!\n")
                await agent.connect()
                await until(lambda: stored_text(db, member_id).endswith("disconnected\n"))

                out.write(b"last line")  # no newline: the drain on stop ships it
            stop.set()
            result = await asyncio.wait_for(shipper, 20)
            assert result.unshipped == {} and result.streams["stdout"].gave_up is None
            assert stored_text(db, member_id) == "step 1\nprice €\nwritten while disconnected\nlast line"
            assert stored_text(db, member_id, "stderr") == "warning\ufffd!\n"
            chunks_before = db.fetch_one("SELECT count(*) AS n FROM member_log_chunks")["n"]

            # A restarted agent ships from offset 0 again: the server's answers skip what it holds.
            with open(stdout, "ab") as out:
                out.write(b"\nafter restart\n")
            again = asyncio.Event()
            again.set()
            second = await asyncio.wait_for(ship_logs(agent.ctx, member_id, logs, again, interval=0.05), 20)
            assert second.streams["stdout"].shipped_bytes == len(b"\nafter restart\n")
            assert stored_text(db, member_id).endswith("last line\nafter restart\n")
            assert db.fetch_one("SELECT count(*) AS n FROM member_log_chunks")["n"] == chunks_before + 1

            # A member that is not on this node: the stream is given up, nothing raises.
            fleet_id = db.fetch_one("SELECT fleet_id FROM nodes WHERE id = %s", (node_id,))["fleet_id"]
            other_node = await asyncio.to_thread(make_node, db, fleet_id, "n2")
            foreign = await asyncio.to_thread(_member_on_node, db, other_node, 2)  # only n2 has 2 free
            refused = await asyncio.wait_for(ship_logs(agent.ctx, foreign, logs, again), 20)
            assert "not placed on this node" in (refused.streams["stdout"].gave_up or "")

            # Past the server's per-stream limit the shipper stops sending that stream (one chunk counted).
            await asyncio.to_thread(
                db.fetch_all, "UPDATE member_log_settings SET max_stream_bytes = 10 RETURNING 1"
            )
            with open(stdout, "ab") as out:
                out.write(b"x" * 300_000)
            capped = await asyncio.wait_for(
                ship_logs(agent.ctx, member_id, logs, again, chunk_bytes=65536), 20
            )
            assert capped.streams["stdout"].gave_up == "over the server's per-stream log limit"
            dropped = db.fetch_one(
                "SELECT dropped_bytes FROM member_log_streams WHERE member_id = %s AND stream = 'stdout'",
                (member_id,),
            )
            assert dropped["dropped_bytes"] == 65536
            await agent.drop()

    asyncio.run(scenario())


def test_utf8_cut_holds_back_an_incomplete_last_character() -> None:
    text = "a€b😀".encode()
    assert utf8_cut(text) == len(text)
    assert utf8_cut(text[:-1]) == len(text) - 4
    assert utf8_cut("a€".encode()[:-2]) == 1
    assert utf8_cut(b"plain") == 5
