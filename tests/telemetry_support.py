"""Shared pieces of the telemetry tests: users, a minimal job row, tokens, and an in-process gateway
serving real HTTP on loopback."""

from __future__ import annotations

import asyncio
import datetime as dt
import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

from aiohttp import web

from tests.conftest import free_port
from tuneplane.app.db import Database
from tuneplane.app.security import hash_password, new_token
from tuneplane.app.telemetry.gateway import create_app
from tuneplane.app.telemetry.tokens import issue_member_token


def make_user(db: Database, username: str, role: str = "user") -> int:
    return db.call("create_user", username, hash_password("pw-" + username), role)[0]["id"]


def make_job(db: Database, owner_id: int) -> int:
    """A job row for telemetry tests (the submission path is tested elsewhere): rows written directly."""
    with db.transaction() as conn:
        fleet = conn.execute(
            "INSERT INTO fleets (name, backend) VALUES (%s, 'node') RETURNING id",
            (f"f-{uuid.uuid4().hex[:10]}",),
        ).fetchone()["id"]
        preview = conn.execute(
            "INSERT INTO previews (owner_id, fleet_id, spec, resolved, canonical, digest, expires_at)"
            " VALUES (%s, %s, '{}', '{}', '{}', %s, now() + interval '1 hour') RETURNING id",
            (owner_id, fleet, "0" * 64),
        ).fetchone()["id"]
        return conn.execute(
            "INSERT INTO jobs (owner_id, preview_id, fleet_id, state_reason, nodes, gpus_per_node,"
            " cpus_per_node, memory_per_node, max_attempts, spec)"
            " VALUES (%s, %s, %s, 'test job', 1, 0, 1, 0, 1, '{}')"
            " RETURNING id",
            (owner_id, preview, fleet),
        ).fetchone()["id"]


def member_token(
    db: Database, job_id: int, attempt: int = 1, rank: int = 0, ttl: dt.timedelta | None = None
) -> str:
    return issue_member_token(db, job_id, attempt, rank, ttl)


def user_api_token(db: Database, user_id: int) -> str:
    plaintext, digest = new_token("tpu")
    db.call("issue_api_token", user_id, "cli", digest, None)
    return plaintext


class GatewayThread:
    """The telemetry gateway's aiohttp app on a loopback port, in a thread with its own event loop."""

    def __init__(self, database_url: str, port: int | None = None) -> None:
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._database_url = database_url
        self._loop = asyncio.new_event_loop()
        self._started = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._runner: web.AppRunner | None = None

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)

        async def start() -> None:
            self._runner = web.AppRunner(create_app(self._database_url, pool_max=4))
            await self._runner.setup()
            await web.TCPSite(self._runner, "127.0.0.1", self.port).start()

        self._loop.run_until_complete(start())
        self._started.set()
        self._loop.run_forever()

    def start(self) -> GatewayThread:
        self._thread.start()
        if not self._started.wait(20):
            raise RuntimeError("telemetry gateway did not start")
        return self

    def stop(self) -> None:
        async def stop() -> None:
            if self._runner is not None:
                await self._runner.cleanup()

        asyncio.run_coroutine_threadsafe(stop(), self._loop).result(20)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(20)


@contextmanager
def running_gateway(database_url: str, port: int | None = None) -> Iterator[GatewayThread]:
    gateway = GatewayThread(database_url, port).start()
    try:
        yield gateway
    finally:
        gateway.stop()
