"""The `check` every TunePlane connection pool runs before it hands out a connection (psycopg_pool).

psycopg_pool's own check_connection sends an empty query: a round trip to PostgreSQL for every call,
before the call's own query. On a busy node gateway that was an eighth of its time (py-spy, issue 23): every
report, every artifact chunk waited for it. A connection that PostgreSQL ended — a restart, a crash,
pg_terminate_backend, idle_session_timeout — has something to read on its socket: the server's FATAL
message or the end of the stream. So an idle connection whose socket has nothing to read is handed out at
once, and only one with something waiting (or already known broken) gets the round trip, which replaces
it when it is dead. A connection that something else woke (a NOTICE, a parameter change) costs the round
trip, as before. What no check catches either way is a connection that breaks between check and use.
"""

from __future__ import annotations

import select

import psycopg
from psycopg_pool import AsyncConnectionPool, ConnectionPool


def socket_quiet(conn: psycopg.Connection | psycopg.AsyncConnection) -> bool:
    """True when an idle connection is open and its socket has nothing to read."""
    if conn.closed or conn.broken:
        return False
    try:
        fd = conn.pgconn.socket
    except psycopg.OperationalError:
        return False
    poller = select.poll()
    poller.register(fd, select.POLLIN | select.POLLPRI)
    return not poller.poll(0)


def check(conn: psycopg.Connection) -> None:
    if not socket_quiet(conn):
        ConnectionPool.check_connection(conn)


async def check_async(conn: psycopg.AsyncConnection) -> None:
    if not socket_quiet(conn):
        await AsyncConnectionPool.check_connection(conn)
