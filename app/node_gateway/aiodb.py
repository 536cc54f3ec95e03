"""Async stored-function calls for the gateway (psycopg 3 AsyncConnectionPool, autocommit).

Each call is one `SELECT * FROM function(...)` in its own transaction; a `TPnnn` error becomes a Refusal,
exactly as app.db.Database does for the synchronous side.
"""

from __future__ import annotations

import asyncio
import random
from typing import Any

import psycopg
from psycopg import sql
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb
from psycopg_pool import AsyncConnectionPool

from tuneplane.app import pool_check, reconnect
from tuneplane.app.db import SEARCH_PATH_OPTION
from tuneplane.app.db_functions import check_args
from tuneplane.app.errors import (
    RETRY_PAUSES,
    busy_refusal,
    connection_ended,
    log_retry,
    refusal_from_db,
    rolled_back,
)
from tuneplane.app.gateway_limits import data_refusal


def jsonb(value: Any) -> Jsonb:
    return Jsonb(value)


class AsyncDatabase:
    def __init__(self, url: str, *, min_size: int = 2, max_size: int = 8, name: str = "tuneplane-gateway"):
        self.url = url
        self.name = name
        self.pool = AsyncConnectionPool(
            url,
            min_size=min_size,
            max_size=max_size,
            name=name,
            open=False,
            kwargs={
                "row_factory": dict_row,
                "options": SEARCH_PATH_OPTION,
                "application_name": name,
                "autocommit": True,
            },
            # A connection broken by a database restart is found and replaced before use, so the first
            # report after a restart is not answered 503 for nothing (app/pool_check.py: a round trip only
            # when the connection's socket has something to read).
            check=pool_check.check_async,
            timeout=30,
        )

    async def open(self) -> None:
        await self.pool.open(wait=True, timeout=30)

    async def close(self) -> None:
        await self.pool.close()

    async def call(self, function: str, *args: Any) -> list[dict]:
        check_args(function, args)
        placeholders = sql.SQL(", ").join(sql.Placeholder() for _ in args)
        query = sql.SQL("SELECT * FROM {}({})").format(sql.Identifier(function), placeholders)
        return await self.fetch_all(query, args)

    async def call_one(self, function: str, *args: Any) -> dict:
        rows = await self.call(function, *args)
        return rows[0]

    async def call_retrying(self, function: str, *args: Any) -> list[dict]:
        """`call`, run again after a deadlock or serialization failure (rolled back: nothing of it happened);
        still failing after RETRY_PAUSES, a 503 Refusal. Run once more, at once, on another connection when
        the server ended the one it used (terminated just after the pool's check: the statement never ran,
        or ran unanswered); a second end is raised (the database itself is in trouble: the caller answers
        that it may not have been recorded). Only for idempotent calls (reports, acks, a placement pass)."""
        try:
            return await self._call_retrying(function, *args)
        except psycopg.Error as exc:
            if not connection_ended(exc):
                raise
            log_retry(function, exc, 1)
            return await self._call_retrying(function, *args)

    async def _call_retrying(self, function: str, *args: Any) -> list[dict]:
        for attempt, pause in enumerate((*RETRY_PAUSES, None), start=1):
            try:
                return await self.call(function, *args)
            except psycopg.Error as exc:
                if not rolled_back(exc):
                    raise
                if pause is None:
                    raise busy_refusal(function, exc, attempt) from exc
                log_retry(function, exc, attempt)
                await asyncio.sleep(pause * (1 + random.random()))
        raise AssertionError("unreachable")

    async def fetch_all(self, query: Any, params: Any = None) -> list[dict]:
        async with self.pool.connection() as conn:
            try:
                cursor = await conn.execute(query, params)
                return await cursor.fetchall() if cursor.description else []
            except psycopg.Error as exc:
                await reconnect.discard_if_stale_async(conn, exc)  # left on a standby by a failover
                refusal = refusal_from_db(exc)
                if refusal is not None:
                    raise refusal from exc
                if isinstance(exc, psycopg.DataError):  # a value the client sent that SQL cannot take
                    raise data_refusal(exc) from exc
                raise

    async def listen_connection(self) -> psycopg.AsyncConnection:
        """A dedicated autocommit connection for LISTEN (outside the pool: it is held forever)."""
        return await psycopg.AsyncConnection.connect(
            self.url, autocommit=True, options=SEARCH_PATH_OPTION, application_name=f"{self.name}-listen"
        )
