"""PostgreSQL failover under TunePlane's connection handling (issue 33), with a real primary and a
synchronous standby (tests/pg_failover.py): kill -9 of the primary's postmaster and backends, promotion
of the standby.

Checked: the shared LISTEN loops every long-lived process runs (app/reconnect.py: the node gateway, the
node worker, the Slurm worker) listen again on the new primary and run their poll once (a NOTIFY sent after
the failover wakes them); the pools (app.db.Database, the gateways' AsyncDatabase) reach the new primary
through the multi-host URL; every commit a writer saw confirmed during a burst across the kill is on the
new primary. Printed (bench-style, not asserted): kill -> promotion (observed on the standby) and kill ->
first commit confirmed by the new primary — a commit counts only when the server that confirmed it (its
`inet_server_port()`, returned by the INSERT itself) is the promoted standby, never the killed primary.
"""

from __future__ import annotations

import asyncio
import threading
import time

import psycopg
import pytest

from tests import patroni_failover
from tests.pg_failover import available, failover_cluster
from tuneplane.app import reconnect
from tuneplane.app.db import Database
from tuneplane.app.node_gateway.aiodb import AsyncDatabase

pytestmark = [pytest.mark.e2e, pytest.mark.skipif(available() is not None, reason=str(available()))]

DEADLINE_S = 120.0  # bounded polls: a failover here takes seconds; the limit only stops a hung test


def _server_port(db: Database) -> int | None:
    try:
        row = db.fetch_one("SELECT inet_server_port() AS port, pg_is_in_recovery() AS standby")
    except psycopg.Error:
        return None
    return None if row is None or row["standby"] else int(row["port"])


class _Burst(threading.Thread):
    """Confirmed single-row commits, one after another, across the kill: what it saw confirmed, and by
    which server (a commit the dying primary confirmed may reach us just after the kill)."""

    def __init__(self, url: str) -> None:
        super().__init__(daemon=True)
        self.url = url
        self.confirmed: list[tuple[int, int, float]] = []  # (id, port of the confirming server, wall time)
        self.stop = threading.Event()

    def run(self) -> None:
        n = 0
        conn: psycopg.Connection | None = None
        while not self.stop.is_set():
            try:
                if conn is None or conn.closed:
                    conn = psycopg.connect(self.url, autocommit=True)
                n += 1
                row = conn.execute(
                    "INSERT INTO failover_burst (id) VALUES (%s) RETURNING inet_server_port()", (n,)
                ).fetchone()
                self.confirmed.append((n, int(row[0]), time.time()))
            except psycopg.Error:
                if conn is not None:
                    conn.close()
                conn = None
                self.stop.wait(0.05)
        if conn is not None:
            conn.close()


# The promotion: `pg_ctl promote` by the test at once, or Patroni's own (etcd3; tests/patroni_failover.py).
CLUSTERS = {"pg_ctl": failover_cluster, "patroni": patroni_failover.patroni_cluster}


@pytest.mark.parametrize("promotion", sorted(CLUSTERS))
def test_failover_reconnects_relistens_and_loses_no_confirmed_commit(promotion: str) -> None:
    if promotion == "patroni" and (reason := patroni_failover.available()) is not None:
        pytest.skip(reason)
    with CLUSTERS[promotion]() as cluster:
        with psycopg.connect(cluster.url, autocommit=True) as conn:
            conn.execute("CREATE TABLE failover_burst (id integer PRIMARY KEY)")
        db = Database(cluster.url, name="tuneplane-failover-test")
        stop_sync = threading.Event()
        sync_listening = threading.Semaphore(0)
        sync_notified: list[str] = []
        sync_thread = threading.Thread(
            target=reconnect.listen_forever_sync,
            args=(
                lambda: psycopg.connect(cluster.url, autocommit=True),
                ("failover_test",),
                lambda n: sync_notified.append(n.payload),
                sync_listening.release,
            ),
            kwargs={"stop": stop_sync, "name": "test-sync"},
            daemon=True,
        )
        sync_thread.start()
        burst = _Burst(cluster.url)
        try:
            assert sync_listening.acquire(timeout=DEADLINE_S)
            assert _server_port(db) == cluster.primary.port
            asyncio.run(_async_side(cluster, db, burst))
            # The sync loop listened again (its poll ran) and a NOTIFY after the failover reached it.
            assert sync_listening.acquire(timeout=DEADLINE_S), "the sync LISTEN loop never listened again"
            deadline = time.monotonic() + DEADLINE_S
            while "after" not in sync_notified and time.monotonic() < deadline:
                db.fetch_all("SELECT pg_notify('failover_test', 'after')")
                time.sleep(0.1)
            assert "after" in sync_notified
        finally:
            burst.stop.set()
            stop_sync.set()
            sync_thread.join(10)
            burst.join(10)
            db.close()
        # Every commit the writer saw confirmed is on the new primary, once.
        with psycopg.connect(cluster.url, autocommit=True) as conn:
            stored = {r[0] for r in conn.execute("SELECT id FROM failover_burst")}
        confirmed = {n for n, _port, _t in burst.confirmed}
        assert confirmed and confirmed <= stored, sorted(confirmed - stored)[:10]
        assert {p for _n, p, _t in burst.confirmed} == {cluster.primary.port, cluster.standby.port}


async def _async_side(cluster, db: Database, burst: _Burst) -> None:
    adb = AsyncDatabase(cluster.url, min_size=1, max_size=2, name="tuneplane-failover-test-async")
    await adb.open()
    listening = asyncio.Semaphore(0)
    notified: list[str] = []
    listener = asyncio.create_task(
        reconnect.listen_forever(
            adb.listen_connection,
            ("failover_test",),
            lambda n: notified.append(n.payload),
            listening.release,
            name="test-async",
        )
    )
    try:
        await asyncio.wait_for(listening.acquire(), DEADLINE_S)
        burst.start()
        while len(burst.confirmed) < 50:  # the burst is in flight when the primary dies
            await asyncio.sleep(0.01)
        await asyncio.to_thread(cluster.fail_over)
        # The pools reach the new primary through the multi-host URL.
        deadline = time.monotonic() + DEADLINE_S
        while await asyncio.to_thread(_server_port, db) != cluster.standby.port:
            assert time.monotonic() < deadline, "the pool never reached the promoted standby"
            await asyncio.sleep(0.1)
        while True:
            try:
                row = (await adb.fetch_all("SELECT inet_server_port() AS port"))[0]
                if row["port"] == cluster.standby.port:
                    break
            except psycopg.Error:
                pass
            assert time.monotonic() < deadline, "the async pool never reached the promoted standby"
            await asyncio.sleep(0.1)
        # A commit confirmed by a different server: the failover is over for writers.
        while not any(port == cluster.standby.port for _n, port, _t in burst.confirmed):
            assert time.monotonic() < deadline, "no commit confirmed by the new primary"
            await asyncio.sleep(0.05)
        first = min(t for _n, port, t in burst.confirmed if port == cluster.standby.port)
        killed, after, promoted = cluster.killed_at, cluster.promoted_after, cluster.promoted_at
        assert killed is not None and after is not None and promoted is not None
        # The count is of the new primary's commits: none can precede its promotion.
        assert first > after, (first - killed, after - killed)
        print(
            f"\nfailover ({cluster.how}): kill -9 -> standby promoted "
            f"{after - killed:.2f}..{promoted - killed:.2f}s; "
            f"kill -> first commit confirmed by the new primary (port {cluster.standby.port}, the killed "
            f"one's {cluster.primary.port}) {first - killed:.2f}s "
            f"({first - promoted:+.2f}s from the promotion seen)"
        )
        # The async LISTEN loop listened again (its poll ran) and hears a NOTIFY sent after the failover.
        await asyncio.wait_for(listening.acquire(), DEADLINE_S)
        while "after" not in notified:
            assert time.monotonic() < deadline, "the async LISTEN loop missed the NOTIFY after failover"
            await adb.fetch_all("SELECT pg_notify('failover_test', 'after')")
            await asyncio.sleep(0.1)
    finally:
        listener.cancel()
        await asyncio.gather(listener, return_exceptions=True)
        await adb.close()
