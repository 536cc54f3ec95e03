"""The one module that owns database connections and transactions (psycopg 3, plain SQL, no ORM).

Every connection runs with `search_path = tuneplane, public` so stored functions are called by their
plain names. State changes are stored-function calls; Python never UPDATEs a state column itself.
"""

from __future__ import annotations

import random
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

import psycopg
from psycopg import sql
from psycopg.rows import dict_row
from psycopg_pool import ConnectionPool

from tuneplane.app import pool_check, reconnect
from tuneplane.app.db_functions import check_args
from tuneplane.app.errors import RETRY_PAUSES, busy_refusal, log_retry, refusal_from_db, rolled_back

SEARCH_PATH_OPTION = "-c search_path=tuneplane,public"

# The API token the current request acts under (None: a console session, a worker, a command). Every
# transaction opened while it is set carries it as `tuneplane.token_id`, so the stored functions narrow the
# user's roles by the token's scope themselves (teams.sql: token_allows). Set per request by app/web/auth.
request_token_id: ContextVar[int | None] = ContextVar("request_token_id", default=None)
# The transaction this context has open, by Database: a call or fetch made inside `with db.transaction()`
# joins it (a savepoint on the same connection), so several stored-function calls commit or roll back
# together (app/web/fleet.py: a fleet and its storage).
_open_transaction: ContextVar[tuple[Database, psycopg.Connection] | None] = ContextVar(
    "tuneplane_open_transaction", default=None
)


def connect(url: str, *, autocommit: bool = False, application_name: str = "tuneplane") -> psycopg.Connection:
    """A single connection for short-lived commands (migrate, admin)."""
    return psycopg.connect(
        url,
        autocommit=autocommit,
        row_factory=dict_row,
        options=SEARCH_PATH_OPTION,
        application_name=application_name,
    )


class Database:
    """A small connection pool plus helpers that translate stored-function refusals into Refusal."""

    def __init__(self, url: str, *, min_size: int = 1, max_size: int = 8, name: str = "tuneplane") -> None:
        self.url = url
        self.pool = ConnectionPool(
            url,
            min_size=min_size,
            max_size=max_size,
            name=name,
            open=True,
            kwargs={
                "row_factory": dict_row,
                "options": SEARCH_PATH_OPTION,
                "application_name": name,
                "autocommit": False,
            },
            # A connection broken by a database restart (the embedded one is restarted by `up`'s
            # supervisor) is found and replaced before use instead of failing a request; one whose
            # socket has nothing to read goes without a round trip (app/pool_check.py).
            check=pool_check.check,
            # A pool that cannot reach the database must not hang a request forever.
            timeout=10,
        )

    def close(self) -> None:
        self.pool.close()

    @contextmanager
    def transaction(self) -> Iterator[psycopg.Connection]:
        """One transaction on a pooled connection; a TPnnn error leaves as a Refusal. Inside an open one of
        this Database (same thread or task), a savepoint of it: its calls commit or roll back together."""
        joined = _open_transaction.get()
        if joined is not None and joined[0] is self:
            with joined[1].transaction():
                yield joined[1]
            return
        with self.pool.connection() as conn:
            try:
                with conn.transaction():
                    token_id = request_token_id.get()
                    if token_id is not None:
                        conn.execute("SELECT set_config('tuneplane.token_id', %s, true)", (str(token_id),))
                    opened = _open_transaction.set((self, conn))
                    try:
                        yield conn
                    finally:
                        _open_transaction.reset(opened)
            except psycopg.Error as exc:
                reconnect.discard_if_stale(conn, exc)  # left on a standby by a failover
                refusal = refusal_from_db(exc)
                if refusal is not None:
                    raise refusal from exc
                raise

    def fetch_all(
        self, query: str | sql.Composable, params: Sequence[Any] | dict | None = None
    ) -> list[dict]:
        with self.transaction() as conn:
            return conn.execute(query, params).fetchall()

    def fetch_one(
        self, query: str | sql.Composable, params: Sequence[Any] | dict | None = None
    ) -> dict | None:
        with self.transaction() as conn:
            return conn.execute(query, params).fetchone()

    def call(self, function: str, *args: Any) -> list[dict]:
        """`SELECT * FROM function(args…)` in its own transaction (within `db.transaction()`: that one)."""
        check_args(function, args)
        placeholders = sql.SQL(", ").join(sql.Placeholder() for _ in args)
        query = sql.SQL("SELECT * FROM {}({})").format(sql.Identifier(function), placeholders)
        return self.fetch_all(query, args)

    def call_retrying(self, function: str, *args: Any) -> list[dict]:
        """`call`, run again after a deadlock or serialization failure (the transaction was rolled back, so
        nothing of it happened); still failing after RETRY_PAUSES, a 503 Refusal that says so."""
        for attempt, pause in enumerate((*RETRY_PAUSES, None), start=1):
            try:
                return self.call(function, *args)
            except psycopg.Error as exc:
                if not rolled_back(exc):
                    raise
                if pause is None:
                    raise busy_refusal(function, exc, attempt) from exc
                log_retry(function, exc, attempt)
                time.sleep(pause * (1 + random.random()))
        raise AssertionError("unreachable")

    def ping(self) -> bool:
        try:
            with self.pool.connection(timeout=2) as conn:
                conn.execute("SELECT 1")
            return True
        except Exception:
            return False
