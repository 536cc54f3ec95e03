"""The node gateway in this process (aiohttp on a loopback port) with real agent sessions against it."""

from __future__ import annotations

import asyncio
import datetime as dt
import os
import stat
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import aiohttp
import pytest
from aiohttp.test_utils import TestServer
from psycopg.types.json import Jsonb

from tests.node_helpers import events, fast_thresholds, make_fleet, make_token, simulated_capacity
from tuneplane.app.db import Database
from tuneplane.app.node_gateway.aiodb import AsyncDatabase
from tuneplane.app.node_gateway.reports import REPORT_FUNCTIONS
from tuneplane.app.node_gateway.server import Gateway
from tuneplane.app.security import token_hash
from tuneplane.workers.agent.credential import FileCredentialStore, MemoryCredentialStore
from tuneplane.workers.agent.directories import AgentPaths
from tuneplane.workers.agent.handlers import COMMAND_HANDLERS, AgentContext, command
from tuneplane.workers.agent.session import ControlSession, Refused, enroll


@asynccontextmanager
async def running_gateway(db_url: str) -> AsyncIterator[tuple[Gateway, str]]:
    gateway = Gateway(AsyncDatabase(db_url, max_size=4), name="test-gw", poll_interval=0.5)
    server = TestServer(gateway.make_app(), host="127.0.0.1")
    await server.start_server()
    try:
        yield gateway, f"http://127.0.0.1:{server.port}"
    finally:
        await server.close()


async def until(predicate: Callable[[], object], timeout: float = 10.0) -> object:
    """Bounded poll inside the event loop (the async twin of tests.helpers.wait_for)."""
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"timed out after {timeout}s")
        await asyncio.sleep(0.02)


def test_agent_enrolls_connects_reports_capacity_and_runs_commands_in_order(
    db_url: str, db: Database, tmp_path: Path
) -> None:
    fast_thresholds(db, heartbeat=0.2, stale=2, lost=4)
    make_fleet(db)
    token = make_token(db)
    seen: list[int] = []

    @command("test.record")
    async def record(ctx: AgentContext, payload: dict) -> dict:
        seen.append(payload["i"])
        return {"i": payload["i"], "node": ctx.node}

    async def scenario() -> None:
        async with running_gateway(db_url) as (_gateway, url), aiohttp.ClientSession() as http:
            paths = AgentPaths.prepare(tmp_path / "state")
            store = FileCredentialStore(paths.credential_path)
            store.save(await enroll(http, url, token, "n1"))
            assert stat.S_IMODE(os.stat(paths.credential_path).st_mode) == 0o600
            session = ControlSession(
                http, url, store, AgentContext(paths=paths), simulated_capacity, say=lambda _m: None
            )
            task = asyncio.create_task(session.run())
            await asyncio.wait_for(session.connected.wait(), 10)
            node_id = session.ctx.node_id
            # Commands flow once the session reconciled (the launch hook does this in `tuneplane node`).
            await session.report("reconcile", {"running": [], "exited": []})
            for i in range(5):
                await asyncio.to_thread(
                    db.call, "enqueue_node_command", node_id, "test.record", Jsonb({"i": i}), "t"
                )
            await until(lambda: len(seen) == 5)

            def acked() -> bool:
                return (
                    db.fetch_one("SELECT count(*) AS n FROM node_commands WHERE acked_at IS NOT NULL")["n"]
                    == 5
                )

            await until(acked)
            await until(lambda: db.fetch_one("SELECT gpus FROM v_nodes")["gpus"] == 2)
            await until(
                lambda: db.fetch_one("SELECT connectivity FROM v_nodes")["connectivity"] == "connected"
            )
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    try:
        asyncio.run(scenario())
    finally:
        COMMAND_HANDLERS.pop("test.record", None)
    assert seen == [0, 1, 2, 3, 4]
    result = db.fetch_one("SELECT result FROM node_commands ORDER BY id DESC LIMIT 1")["result"]
    assert result == {"i": 4, "node": "n1"}
    node = db.fetch_one("SELECT * FROM v_nodes")
    assert node["simulated_gpus"] == 2 and node["agent_version"] == "test"
    kinds = [e["kind"] for e in events(db)]
    assert "enrolled" in kinds and "session_opened" in kinds and "capacity" in kinds


def test_commands_written_for_several_nodes_together_are_claimed_in_one_transaction(
    db_url: str, db: Database, tmp_path: Path
) -> None:
    """A COMMIT writes a START for every member's node in one transaction; the gateway claims them for all
    those sessions in one call (claim_sessions_commands), not one claim per node."""
    make_fleet(db)
    names = ["n1", "n2", "n3"]
    held: dict[str, asyncio.Event] = {}
    release = asyncio.Event()

    @command("test.hold")
    async def hold(ctx: AgentContext, payload: dict) -> dict:
        held[ctx.node].set()
        await release.wait()  # unacknowledged until the test has looked at the claimed rows
        return {}

    async def scenario() -> list[int]:
        async with running_gateway(db_url) as (gateway, url), aiohttp.ClientSession() as http:
            gateway.poll_interval = 3600.0  # only the NOTIFY wakes delivery here
            sessions, tasks = [], []
            for name in names:
                held[name] = asyncio.Event()
                paths = AgentPaths.prepare(tmp_path / name)
                store = MemoryCredentialStore()
                store.save(await enroll(http, url, make_token(db), name))
                session = ControlSession(
                    http, url, store, AgentContext(paths=paths), simulated_capacity, say=lambda _m: None
                )
                tasks.append(asyncio.create_task(session.run()))
                await asyncio.wait_for(session.connected.wait(), 10)
                await session.report("reconcile", {"running": [], "exited": []})
                sessions.append(session)
            # NOTIFYs reach the gateway in commit order: once a ping written after every reconcile has been
            # acknowledged, no wake-up of a reconcile is still on its way to start a claim of its own.
            for session in sessions:
                await asyncio.to_thread(
                    db.call, "enqueue_node_command", session.ctx.node_id, "ping", Jsonb({}), "t"
                )
            pinged = "SELECT count(*) AS n FROM node_commands WHERE kind = 'ping' AND acked_at IS NOT NULL"
            await until(lambda: db.fetch_one(pinged)["n"] == len(names))
            await until(lambda: not gateway.claiming)

            def enqueue_together() -> None:
                with db.transaction() as conn:
                    for session in sessions:
                        conn.execute(
                            "SELECT enqueue_node_command(%s, 'test.hold', '{}'::jsonb, 't')",
                            (session.ctx.node_id,),
                        )

            await asyncio.to_thread(enqueue_together)
            await asyncio.wait_for(asyncio.gather(*(e.wait() for e in held.values())), 10)
            # The claim's UPDATE is each row's last writer until the acknowledgement: one transaction id.
            claimers = db.fetch_all(
                "SELECT DISTINCT xmin::text AS x FROM node_commands WHERE kind = 'test.hold'"
            )
            release.set()
            acked = (
                "SELECT count(*) AS n FROM node_commands WHERE kind = 'test.hold' AND acked_at IS NOT NULL"
            )
            await until(lambda: db.fetch_one(acked)["n"] == len(names))
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            return claimers

    try:
        claimers = asyncio.run(scenario())
    finally:
        COMMAND_HANDLERS.pop("test.hold", None)
    assert len(claimers) == 1, claimers


def test_refused_enrollments_answer_clearly_and_leave_events(db_url: str, db: Database) -> None:
    make_fleet(db)
    token = make_token(db)
    expired = make_token(db, ttl=dt.timedelta(milliseconds=1))

    async def scenario() -> list[str]:
        messages = []
        async with running_gateway(db_url) as (_gateway, url), aiohttp.ClientSession() as http:
            await enroll(http, url, token, "n1")
            for attempt_token, name in ((token, "n2"), (expired, "n3"), ("tpe_never_issued", "n4")):
                with pytest.raises(Refused) as refused:
                    await enroll(http, url, attempt_token, name)
                assert refused.value.status == 401
                messages.append(refused.value.message)
        return messages

    reused_msg, expired_msg, unknown_msg = asyncio.run(scenario())
    assert "already used" in reused_msg and "expired" in expired_msg and "unknown" in unknown_msg
    refused = events(db, "refused")
    assert len(refused) == 3
    assert refused[0]["fleet"] == "gpu" and "already used" in refused[0]["reason"]
    assert refused[1]["fleet"] == "gpu" and "expired" in refused[1]["reason"]


def test_wrong_credential_gets_an_error_message_and_an_event(db_url: str, db: Database) -> None:
    async def scenario() -> Refused:
        async with running_gateway(db_url) as (_gateway, url), aiohttp.ClientSession() as http:
            from tuneplane.workers.agent.credential import StoredCredential

            store = MemoryCredentialStore(StoredCredential(1, "ghost", "gpu", "tpn_not_a_real_credential"))
            session = ControlSession(
                http, url, store, AgentContext(), simulated_capacity, say=lambda _m: None
            )
            with pytest.raises(Refused) as refused:
                await session.run()
            return refused.value

    refusal = asyncio.run(scenario())
    assert refusal.status == 401 and refusal.message == "unknown node credential"
    assert "authenticate: unknown node credential" in events(db, "refused")[-1]["reason"]


def test_gateway_rotates_the_credential_over_the_session_and_the_old_one_expires(
    db_url: str, db: Database, tmp_path: Path
) -> None:
    fast_thresholds(db, heartbeat=0.2, stale=2, lost=4, rotate=0.5, grace=1.0)
    make_fleet(db)
    token = make_token(db)

    async def scenario() -> tuple[str, str]:
        async with running_gateway(db_url) as (_gateway, url), aiohttp.ClientSession() as http:
            paths = AgentPaths.prepare(tmp_path / "state")
            store = FileCredentialStore(paths.credential_path)
            store.save(await enroll(http, url, token, "n1"))
            original = store.load().credential
            lines: list[str] = []
            session = ControlSession(
                http, url, store, AgentContext(paths=paths), simulated_capacity, say=lines.append
            )
            task = asyncio.create_task(session.run())
            await until(lambda: any("credential rotated" in line for line in lines))
            await until(lambda: events(db, "credential_rotated"))
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            return original, store.load().credential

    original, rotated = asyncio.run(scenario())
    assert original != rotated
    assert stat.S_IMODE(os.stat(tmp_path / "state" / "node-credential.json").st_mode) == 0o600
    assert db.call("authenticate_node_credential", token_hash(rotated))

    def old_is_refused() -> bool:
        try:
            db.call("authenticate_node_credential", token_hash(original))
        except Exception as exc:
            return "rotated out" in str(exc)
        return False

    from tests.helpers import wait_for

    wait_for(old_is_refused, timeout=10)


def test_a_session_opened_with_a_rotated_out_credential_gets_no_rotation(
    db_url: str, db: Database, tmp_path: Path
) -> None:
    """A stale copy of the state directory (an old credential still in its grace period) connects after the
    real agent rotated: the gateway never rotates from it, so the real agent's credential stays current."""
    fast_thresholds(db, heartbeat=0.2, stale=2, lost=4, rotate=0.5, grace=60.0)
    make_fleet(db)
    token = make_token(db)

    async def scenario() -> tuple[str, list[str]]:
        async with running_gateway(db_url) as (_gateway, url), aiohttp.ClientSession() as http:
            enrolled = await enroll(http, url, token, "n1")
            stale_copy = MemoryCredentialStore(enrolled)
            paths = AgentPaths.prepare(tmp_path / "state")
            store = FileCredentialStore(paths.credential_path)
            store.save(enrolled)
            lines: list[str] = []
            real = ControlSession(
                http, url, store, AgentContext(paths=paths), simulated_capacity, say=lines.append
            )
            task = asyncio.create_task(real.run())
            await until(lambda: events(db, "credential_rotated"))
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            stale_lines: list[str] = []
            stale = ControlSession(
                http, url, stale_copy, AgentContext(), simulated_capacity, say=stale_lines.append
            )
            task = asyncio.create_task(stale.run())
            await asyncio.wait_for(stale.connected.wait(), 10)
            await asyncio.sleep(1.5)  # three rotation periods: the gateway would have rotated by now
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            return store.load().credential, stale_lines

    current, stale_lines = asyncio.run(scenario())
    assert not any("credential rotated" in line for line in stale_lines)
    assert len(events(db, "credential_rotated")) == 1
    row = db.call("authenticate_node_credential", token_hash(current))[0]
    live = db.fetch_all(
        "SELECT id FROM node_credentials WHERE revoked_at IS NULL AND grace_until IS NULL ORDER BY id"
    )
    assert live == [{"id": row["credential_id"]}]


def test_reports_dispatch_through_the_registry_and_unknown_kinds_are_refused(
    db_url: str, db: Database
) -> None:
    make_fleet(db)
    token = make_token(db)
    assert REPORT_FUNCTIONS["capacity"] == "report_node_capacity"

    async def scenario() -> None:
        async with running_gateway(db_url) as (_gateway, url), aiohttp.ClientSession() as http:
            store = MemoryCredentialStore(await enroll(http, url, token, "n1"))
            session = ControlSession(
                http, url, store, AgentContext(), simulated_capacity, say=lambda _m: None
            )
            task = asyncio.create_task(session.run())
            await asyncio.wait_for(session.connected.wait(), 10)
            result = await session.report("note", {"message": "GPU 3 fell off the bus"})
            assert "event_id" in result
            with pytest.raises(Refused) as unknown:
                await session.report("no.such.kind", {})
            assert unknown.value.status == 400
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    asyncio.run(scenario())
    assert events(db, "note")[-1]["reason"] == "GPU 3 fell off the bus"
