"""The pools' check (app/pool_check.py): a healthy idle connection is handed out without a round trip, and
a connection PostgreSQL ended is still found and replaced before a call uses it, in the sync pool (console,
worker, artifact receiver) and the async one (node and telemetry gateways). Real PostgreSQL, real
pg_terminate_backend; the only stand-in is a counter around psycopg_pool's own round-trip check."""

from __future__ import annotations

import asyncio
import os
import signal

import psycopg
import pytest
from psycopg_pool import AsyncConnectionPool, ConnectionPool

from tuneplane.app.db import Database
from tuneplane.app.node_gateway.aiodb import AsyncDatabase

PID = "SELECT pg_backend_pid() AS pid"


@pytest.fixture
def round_trips(monkeypatch) -> list[str]:
    """Each call of psycopg_pool's round-trip check, by pool kind."""
    calls: list[str] = []
    sync_check, async_check = ConnectionPool.check_connection, AsyncConnectionPool.check_connection

    def counted(conn):
        calls.append("sync")
        return sync_check(conn)

    async def counted_async(conn):
        calls.append("async")
        return await async_check(conn)

    monkeypatch.setattr(ConnectionPool, "check_connection", staticmethod(counted))
    monkeypatch.setattr(AsyncConnectionPool, "check_connection", staticmethod(counted_async))
    return calls


def terminate(db_url: str, pid: int) -> None:
    """End a backend the way a restart or an operator does, and wait until it is gone."""
    with psycopg.connect(db_url, autocommit=True) as conn:
        assert conn.execute("SELECT pg_terminate_backend(%s, 10000)", (pid,)).fetchone()[0]


def test_sync_pool_skips_the_round_trip_for_a_quiet_connection_and_replaces_an_ended_one(
    db_url: str, round_trips: list[str]
) -> None:
    pool = Database(db_url, min_size=1, max_size=1, name="pool-check")
    try:
        first = pool.fetch_one(PID)["pid"]
        for _ in range(5):
            assert pool.fetch_one(PID)["pid"] == first
        assert round_trips == []  # five calls, no empty query before any of them

        terminate(db_url, first)
        replaced = pool.fetch_one(PID)["pid"]  # no error: the check saw the end and took a new connection
        assert replaced != first
        assert round_trips == ["sync"]
    finally:
        pool.close()


def test_async_pool_skips_the_round_trip_for_a_quiet_connection_and_replaces_an_ended_one(
    db_url: str, round_trips: list[str]
) -> None:
    async def scenario() -> None:
        pool = AsyncDatabase(db_url, min_size=1, max_size=1, name="pool-check-async")
        await pool.open()
        try:
            first = (await pool.fetch_all(PID))[0]["pid"]
            for _ in range(5):
                assert (await pool.fetch_all(PID))[0]["pid"] == first
            assert round_trips == []

            await asyncio.to_thread(terminate, db_url, first)
            replaced = (await pool.fetch_all(PID))[0]["pid"]
            assert replaced != first
            assert round_trips == ["async"]
        finally:
            await pool.close()

    asyncio.run(scenario())


def test_a_gateway_report_survives_its_connection_ending_just_after_the_pools_check(db_url: str) -> None:
    # The check hands out a quiet connection without a round trip (ADR 0250); a backend terminated a moment
    # later (its FATAL not yet on the socket) fails the statement sent on it. CI met that by chance
    # (tests/db/test_db_trouble.py: a report right after the gateway's connections were killed). Made
    # certain here: the backend is stopped (SIGSTOP) before pg_terminate_backend, so nothing reaches its
    # socket until the call has taken the connection; woken, it ends with 57P01 instead of answering.
    # call_retrying (idempotent calls: reports, acks) runs the call once more on another connection.
    async def scenario() -> None:
        db = AsyncDatabase(db_url, min_size=1, max_size=2, name="pool-ended")
        await db.open()
        first = (await db.fetch_all(PID))[0]["pid"]
        os.kill(first, signal.SIGSTOP)
        try:
            with psycopg.connect(db_url, autocommit=True) as conn:
                assert conn.execute("SELECT pg_terminate_backend(%s)", (first,)).fetchone()[0]
            call = asyncio.create_task(db.call_retrying("pg_backend_pid"))
            for _ in range(500):  # until the call holds the quiet connection (bounded)
                if db.pool.get_stats()["pool_available"] == 0:
                    break
                await asyncio.sleep(0.01)
            assert db.pool.get_stats()["pool_available"] == 0
        finally:
            os.kill(first, signal.SIGCONT)
        try:
            row = (await asyncio.wait_for(call, 30))[0]
            assert row["pg_backend_pid"] != first
        finally:
            await db.close()

    asyncio.run(scenario())
