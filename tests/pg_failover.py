"""A real PostgreSQL primary with a synchronous streaming standby, and a failover by `kill -9` (issue 33).

Debian's PostgreSQL binaries (/usr/lib/postgresql/N/bin), run as the `postgres` system user (PostgreSQL
refuses root). The standby is made by `pg_basebackup -R` and is the primary's synchronous standby
(`synchronous_standby_names`, `synchronous_commit = on`): a commit the primary confirmed is on the standby.
`fail_over()` is the machine dying: SIGKILL to the primary's postmaster and every backend it forked (no
shutdown checkpoint, sockets reset), then `pg_ctl promote` on the standby — the step Patroni takes in
production (docs/operations.md); the test measures everything after the kill.

Times (`killed_at`, `promoted_at`) are wall-clock seconds (time.time()), comparable with the database's own
timestamps on this host. The promotion is observed, not assumed: `promoted_after`..`promoted_at` bracket
the moment the standby left recovery (wait_primary: a poll every 5 ms; `pg_ctl promote -w` itself looks
only every 100 ms, so its return is up to 0.1 s late and a commit on the new primary seemed to precede it).

`url` is the multi-host URL every process gets, exactly as in production: both hosts,
`target_session_attrs=read-write` (psycopg tries them in turn and keeps the one that takes writes) and a
short `connect_timeout` (a dead host must not hold a connect for long).
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, TypeVar

import psycopg

from tests.conftest import free_port
from tuneplane.app.migrate import migrate

USER = "postgres"
DBNAME = "tuneplane"


def pg_bin() -> Path | None:
    root = Path("/usr/lib/postgresql")
    versions = sorted((p for p in root.glob("*/bin") if (p / "pg_ctl").exists()), reverse=True)
    return versions[0] if versions else None


def available() -> str | None:
    """None when a failover cluster can run here, else why not (a skip reason)."""
    if pg_bin() is None:
        return "Debian's postgresql package is not installed (/usr/lib/postgresql/N/bin)"
    try:
        pwd.getpwnam(USER)
    except KeyError:
        return f"no `{USER}` system user to run PostgreSQL as"
    if os.geteuid() != 0:
        return "starting PostgreSQL as the postgres user needs root"
    return None


@dataclass
class Node:
    name: str
    data: Path
    port: int

    def dsn(self, dbname: str = DBNAME) -> str:
        return f"host=127.0.0.1 port={self.port} user={USER} dbname={dbname} connect_timeout=2"

    def postmaster_pid(self) -> int | None:
        with contextlib.suppress(OSError, ValueError, IndexError):
            return int((self.data / "postmaster.pid").read_text().splitlines()[0])
        return None


class FailoverCluster:
    how = "pg_ctl promote by the test"

    def __init__(self, root: Path) -> None:
        self.root = root
        self.bin = pg_bin()
        assert self.bin is not None
        self.primary = Node("primary", root / "primary", free_port())
        self.standby = Node("standby", root / "standby", free_port())
        self.killed_at: float | None = None
        self.promote_requested_at: float | None = None
        self.promoted_after: float | None = None  # the promotion happened after this ...
        self.promoted_at: float | None = None  # ... and by this (wait_primary)

    @property
    def url(self) -> str:
        hosts = "127.0.0.1,127.0.0.1"
        ports = f"{self.primary.port},{self.standby.port}"
        return (
            f"host={hosts} port={ports} user={USER} dbname={DBNAME} "
            "target_session_attrs=read-write connect_timeout=2"
        )

    def _run(self, *args: str | Path, timeout: float = 120) -> None:
        subprocess.run(
            [str(a) for a in args], check=True, timeout=timeout, user=USER, cwd=self.root,
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        )  # fmt: skip

    def _pg_ctl(self, node: Node, *args: str, wait: bool = True) -> None:
        log = self.root / f"{node.name}.log"
        self._run(self.bin / "pg_ctl", "-D", node.data, "-l", log, "-w" if wait else "-W", *args)

    def start(self) -> None:
        p = self.primary
        self._run(self.bin / "initdb", "-D", p.data, "-U", USER, "-A", "trust", "--no-sync")
        with (p.data / "postgresql.conf").open("a") as conf:
            conf.write(
                f"port = {p.port}\nlisten_addresses = '127.0.0.1'\nunix_socket_directories = '{self.root}'\n"
                "wal_level = replica\nmax_wal_senders = 5\nhot_standby = on\nfsync = off\n"
            )
        self._pg_ctl(p, "start")
        self._run(self.bin / "createdb", "-h", "127.0.0.1", "-p", str(p.port), "-U", USER, DBNAME)
        s = self.standby
        self._run(
            self.bin / "pg_basebackup", "-h", "127.0.0.1", "-p", str(p.port), "-U", USER, "-D", s.data,
            "-R", "-X", "stream", "--no-sync", "--checkpoint=fast",
        )  # fmt: skip
        with (s.data / "postgresql.auto.conf").open("a") as conf:
            conf.write(
                f"primary_conninfo = 'host=127.0.0.1 port={p.port} user={USER} application_name=standby'\n"
            )
        with (s.data / "postgresql.conf").open("a") as conf:
            conf.write(f"port = {s.port}\n")
        self._pg_ctl(s, "start")
        # Only now (a commit would wait for a standby that is not there yet): a confirmed commit is on the
        # standby too, so no acknowledged write is lost by the failover. The standby's copy of the settings
        # predates this, so once promoted it does not wait for a standby of its own (Patroni's
        # synchronous_mode relaxes the same way when no standby is left; synchronous_mode_strict does not).
        with psycopg.connect(p.dsn("postgres"), autocommit=True) as conn:
            conn.execute("ALTER SYSTEM SET synchronous_standby_names = 'standby'")
            conn.execute("ALTER SYSTEM SET synchronous_commit = 'on'")
            conn.execute("SELECT pg_reload_conf()")
        self.wait_synchronous()
        migrate(self.primary.dsn(), progress=lambda _m: None)

    def wait_synchronous(self, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with psycopg.connect(self.primary.dsn("postgres"), autocommit=True) as conn:
                row = conn.execute("SELECT sync_state FROM pg_stat_replication").fetchone()
            if row and row[0] == "sync":
                return
            time.sleep(0.1)
        raise TimeoutError("the standby never became the synchronous standby")

    def kill_primary(self) -> None:
        """The machine dies: SIGKILL to the postmaster and to every process it forked, at once.

        `killed_at` is taken once every signal is sent: from then on each process of the old primary has a
        SIGKILL pending and answers nothing more, so whatever a client starts later is served (if at all)
        by another server."""
        self.killed_at = kill_machine(self.primary)

    def promote(self) -> None:
        """`pg_ctl promote` without its coarse wait; `promoted_at` is when the standby first took writes."""
        with psycopg.connect(self.standby.dsn("postgres"), autocommit=True) as conn:
            self.promote_requested_at = time.time()
            self._pg_ctl(self.standby, "promote", wait=False)
            self.promoted_after, self.promoted_at = wait_primary(conn, self.promote_requested_at)

    def fail_over(self, down_s: float = 0.0) -> None:
        """Kill the primary; `down_s` later (the orchestrator's detection time: Patroni's ttl, ~10 s in
        production) promote the standby. A duration being simulated, not a wait for an event."""
        self.kill_primary()
        if down_s:
            time.sleep(down_s)
        self.promote()

    def stop(self) -> None:
        for node in (self.standby, self.primary):
            pid = node.postmaster_pid()
            if pid is None:
                continue
            with contextlib.suppress(subprocess.SubprocessError, OSError):
                self._pg_ctl(node, "stop", "-m", "immediate")
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def wait_primary(conn: psycopg.Connection, since: float, timeout: float = 120) -> tuple[float, float]:
    """When the server behind `conn` left recovery (took writes), as wall-clock bounds (after, by): `after`
    is when the last query that found it still in recovery was sent (`since`, a time before which it
    cannot have happened, when none did), `by` when the first answer that found it out of recovery came
    back. Polled every 5 ms. Bounded: a promotion here takes well under a second
    (pg_ctl) or one orchestrator loop (Patroni); the limit only stops a hung test."""
    deadline = time.monotonic() + timeout
    after = since
    while True:
        sent = time.time()
        if not conn.execute("SELECT pg_is_in_recovery()").fetchone()[0]:
            return after, time.time()
        after = sent
        if time.monotonic() > deadline:
            raise TimeoutError("the standby was never promoted")
        time.sleep(0.005)


def kill_machine(node: Node, *others: int) -> float:
    """SIGKILL, at once, to `node`'s postmaster, every process it forked and `others` (its Patroni): the
    machine died. Returns when every signal was sent (time.time()): each of them then has a SIGKILL pending
    and answers nothing more."""
    pid = node.postmaster_pid()
    assert pid is not None
    for victim in (*others, pid, *(int(c) for c in _children(pid))):
        with contextlib.suppress(ProcessLookupError):
            os.kill(victim, signal.SIGKILL)
    return time.time()


def _children(pid: int) -> list[str]:
    """The pids whose parent is `pid` (read from /proc: no pkill by name)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, IndexError):
            fields = stat.read_text().rsplit(")", 1)[1].split()
            if int(fields[1]) == pid:
                found.append(stat.parent.name)
    return found


class _Cluster(Protocol):
    def start(self) -> None: ...
    def stop(self) -> None: ...


C = TypeVar("C", bound=_Cluster)


@contextlib.contextmanager
def running(make: Callable[[Path], C], prefix: str) -> Iterator[C]:
    """A cluster made in a fresh directory the postgres user owns, started; stopped and removed after."""
    root = Path(tempfile.mkdtemp(prefix=prefix))
    os.chmod(root, 0o755)
    shutil.chown(root, USER, USER)
    cluster = make(root)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()
        shutil.rmtree(root, ignore_errors=True)


def failover_cluster() -> contextlib.AbstractContextManager[FailoverCluster]:
    return running(FailoverCluster, "tp-failover-")
