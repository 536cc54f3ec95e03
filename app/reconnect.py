"""The one place where a long-lived process rides out the loss of its PostgreSQL primary (issue 33).

A failover (docs/operations.md "Coordinator failover") shows up in three ways: a connection breaks (the
primary died: OperationalError, 57P01/57P02), a connection lands on, or stays on, a server that is no
longer the primary (`25006 read_only_sql_transaction`), or no server answers for a while (connect errors
until the standby is promoted). Every process connects with the same `TUNEPLANE_DATABASE_URL`; a multi-host
one (`host=a,b … target_session_attrs=read-write connect_timeout=2`) makes psycopg itself find the new
primary on each new connection, so reconnecting is simply connecting again, with bounded back-off.

What lives here, so that no process keeps a twin of it:
- `needs_reconnect(exc)`: the errors after which a connection is worth nothing (the pools use it to drop a
  connection that a read-only server answered on, so the next call connects to the new primary);
- `backoff()`: the pauses between tries (bounded: a failover takes seconds, not minutes);
- `listen_forever` / `listen_forever_sync`: a LISTEN connection on every channel a process needs, opened
  again after any break, that calls `on_listening` each time it (re)starts listening — the process's one
  poll, which finds whatever a NOTIFY sent while nobody listened would have said;
- `database_away(exc)`: whether a request failed because the database is away (answered 503 + Retry-After);
- `RETRY_AFTER_S`: the `Retry-After` the HTTP servers send with a 503 while the database is away (the
  clients read it with app/client/transport.retry_after).
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Awaitable, Callable, Iterable, Iterator

import psycopg

from tuneplane.app.errors import connection_ended, rolled_back

log = logging.getLogger("tuneplane.reconnect")

# Seconds a client should wait before retrying a request answered 503 because the database was away: about
# one loop of an orchestrator's promotion (Patroni with loop_wait 1..10 s), short enough that a client
# that honours it sees the new primary within a second or two of its promotion.
RETRY_AFTER_S = 2

# The server is (now) a standby or was demoted: a write cannot succeed on this connection ever again.
READ_ONLY_SQLSTATES = ("25006",)

FIRST_PAUSE_S = 0.25
MAX_PAUSE_S = 5.0


def read_only(exc: BaseException) -> bool:
    return isinstance(exc, psycopg.Error) and (exc.sqlstate or "") in READ_ONLY_SQLSTATES


def needs_reconnect(exc: BaseException) -> bool:
    """True when the connection that raised `exc` must be replaced: it broke, the server ended it, or the
    server is no longer the primary."""
    return read_only(exc) or connection_ended(exc) or isinstance(exc, psycopg.InterfaceError)


def database_away(exc: BaseException) -> bool:
    """True for what a request meets while the database restarts or fails over: no connection (none in
    time: PoolTimeout), a broken one, or a server that is read-only now. Not a rolled-back transaction (a
    deadlock victim: the database is there)."""
    if read_only(exc):
        return True
    return isinstance(exc, psycopg.OperationalError) and not rolled_back(exc)


def discard_if_stale(conn: psycopg.Connection, exc: BaseException) -> None:
    """Close a pooled connection that answered from a read-only server, so that the pool replaces it (a
    closed connection given back is thrown away) and the next call connects to the current primary."""
    if read_only(exc) and not conn.closed:
        log.warning("connection to a read-only server (%s); replacing it", exc.sqlstate)  # type: ignore[attr-defined]
        conn.close()


async def discard_if_stale_async(conn: psycopg.AsyncConnection, exc: BaseException) -> None:
    if read_only(exc) and not conn.closed:
        log.warning("connection to a read-only server (%s); replacing it", exc.sqlstate)  # type: ignore[attr-defined]
        await conn.close()


def backoff(first: float = FIRST_PAUSE_S, most: float = MAX_PAUSE_S) -> Iterator[float]:
    """first, 2·first, 4·first … capped at `most`, forever."""
    pause = first
    while True:
        yield pause
        pause = min(pause * 2, most)


async def listen_forever(
    connect: Callable[[], Awaitable[psycopg.AsyncConnection]],
    channels: Iterable[str],
    on_notify: Callable[[psycopg.Notify], None],
    on_listening: Callable[[], None],
    *,
    stop: asyncio.Event | None = None,
    name: str = "listen",
) -> None:
    """LISTEN on `channels` until `stop` is set (or the task is cancelled), reconnecting after any break.

    `on_listening` runs each time every channel is listened to again: the poll that covers the NOTIFYs
    sent while no connection listened (a failover, a restart). A process that never lost its connection
    calls it once, at start."""
    channels = tuple(channels)
    pauses = backoff()
    while stop is None or not stop.is_set():
        try:
            conn = await connect()
            async with conn:
                for channel in channels:
                    await conn.execute(f"LISTEN {channel}")
                pauses = backoff()
                on_listening()
                async for notify in conn.notifies():
                    on_notify(notify)
        except asyncio.CancelledError:
            raise
        except (psycopg.Error, OSError) as exc:
            pause = next(pauses)
            log.warning("%s: LISTEN lost (%s); reconnecting in %.2fs", name, _first_line(exc), pause)
            if stop is None:
                await asyncio.sleep(pause)
            else:
                try:
                    await asyncio.wait_for(stop.wait(), pause)
                except TimeoutError:
                    pass


def listen_forever_sync(
    connect: Callable[[], psycopg.Connection],
    channels: Iterable[str],
    on_notify: Callable[[psycopg.Notify], None],
    on_listening: Callable[[], None],
    *,
    stop: threading.Event,
    name: str = "listen",
) -> None:
    """`listen_forever` for a thread: the same contract, `stop` checked at least every second."""
    channels = tuple(channels)
    pauses = backoff()
    while not stop.is_set():
        try:
            with connect() as conn:
                for channel in channels:
                    conn.execute(f"LISTEN {channel}")
                pauses = backoff()
                on_listening()
                while not stop.is_set():
                    for notify in conn.notifies(timeout=1.0):
                        on_notify(notify)
        except (psycopg.Error, OSError) as exc:
            pause = next(pauses)
            log.warning("%s: LISTEN lost (%s); reconnecting in %.2fs", name, _first_line(exc), pause)
            stop.wait(pause)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
