"""The failover fixture with the real orchestrator (issue 33): Patroni (etcd3 as its store) manages a primary
and a synchronous replica, and promotes the replica itself when the primary's machine dies.

Debian's `patroni` (3.0.2) and `etcd` (3.4) packages, one etcd member on loopback, two Patroni members, each
with its own REST port, PostgreSQL port and data directory, run as the `postgres` system user (PostgreSQL
refuses root; so does Patroni's postgres). Facts that shape it (docs/operations.md, DESIGN section 11):
  * Patroni 3.0.2 wants `etcd3:` (not `etcd:`); `ttl` sets the failover time (here 5 s, loop_wait 1,
    retry_timeout 2: loop_wait + 2 * retry_timeout <= ttl);
  * synchronous_mode: Patroni itself names the replica in synchronous_standby_names (on a loop_wait
    cycle): a commit the primary confirmed is on the replica;
  * "the machine died" is SIGKILL to Patroni *and* its postmaster with every backend: killing Patroni
    alone leaves the old primary taking writes (no watchdog here);
  * the replica is cloned with `pg_basebackup --checkpoint=fast` (a spread checkpoint takes a minute).

It offers what tests/pg_failover.FailoverCluster offers (`url`, `primary`, `standby`, `fail_over()`,
`killed_at`, `promoted_after`/`promoted_at`), so a test runs on either; here the promotion is Patroni's,
observed on the replica (wait_primary), never requested by the test.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import psycopg

from tests.conftest import free_port
from tests.pg_failover import DBNAME, USER, Node, kill_machine, pg_bin, running, wait_primary
from tuneplane.app.migrate import migrate

TTL_S = 5


def available() -> str | None:
    from tests.pg_failover import available as pg_available

    reason = pg_available()
    if reason is not None:
        return reason
    missing = [b for b in ("patroni", "etcd") if shutil.which(b) is None]
    return f"not installed: {', '.join(missing)} (apt-get install patroni etcd-server)" if missing else None


class PatroniCluster:
    how = f"Patroni promotes (etcd3, ttl {TTL_S} s)"

    def __init__(self, root: Path) -> None:
        self.root = root
        self.nodes = [Node(f"pg{i}", root / f"pg{i}", free_port()) for i in range(2)]
        self.etcd_port, self.etcd_peer_port = free_port(), free_port()
        self.processes: dict[str, subprocess.Popen] = {}
        self.primary: Node = self.nodes[0]
        self.standby: Node = self.nodes[1]
        self.killed_at: float | None = None
        self.promoted_after: float | None = None
        self.promoted_at: float | None = None

    @property
    def url(self) -> str:
        hosts = ",".join("127.0.0.1" for _ in self.nodes)
        ports = ",".join(str(n.port) for n in self.nodes)
        return (
            f"host={hosts} port={ports} user={USER} dbname={DBNAME} "
            "target_session_attrs=read-write connect_timeout=2"
        )

    def _spawn(self, name: str, argv: list[str]) -> None:
        log = open(self.root / f"{name}.log", "ab")  # noqa: SIM115 (closed with the process, in stop)
        self.processes[name] = subprocess.Popen(
            argv, stdout=log, stderr=subprocess.STDOUT, user=USER, cwd=self.root, start_new_session=True
        )
        log.close()

    def _config(self, node: Node, rest_port: int) -> Path:
        path = self.root / f"{node.name}.yml"
        path.write_text(
            f"""scope: tuneplane-test
name: {node.name}
restapi: {{listen: "127.0.0.1:{rest_port}", connect_address: "127.0.0.1:{rest_port}"}}
etcd3: {{hosts: "127.0.0.1:{self.etcd_port}"}}
watchdog: {{mode: "off"}}
bootstrap:
  dcs:
    ttl: {TTL_S}
    loop_wait: 1
    retry_timeout: 2
    synchronous_mode: true
    postgresql:
      parameters: {{wal_level: replica, hot_standby: "on", max_wal_senders: 5, max_replication_slots: 5,
                    fsync: "off", synchronous_commit: "on"}}
  initdb: [{{encoding: UTF8}}, {{auth: trust}}]
  pg_hba: ["local all all trust", "host all all 127.0.0.1/32 trust",
           "host replication all 127.0.0.1/32 trust"]
postgresql:
  listen: "127.0.0.1:{node.port}"
  connect_address: "127.0.0.1:{node.port}"
  data_dir: "{node.data}"
  bin_dir: "{pg_bin()}"
  pgpass: "{self.root}/{node.name}.pgpass"
  basebackup: [{{checkpoint: fast}}]
  authentication:
    superuser: {{username: {USER}, password: unused}}
    replication: {{username: {USER}, password: unused}}
  parameters: {{unix_socket_directories: "{self.root}"}}
"""
        )
        return path

    def start(self, timeout: float = 120) -> None:
        self._spawn(
            "etcd",
            [
                "etcd", "--name", "tp", "--data-dir", str(self.root / "etcd"),
                "--listen-client-urls", f"http://127.0.0.1:{self.etcd_port}",
                "--advertise-client-urls", f"http://127.0.0.1:{self.etcd_port}",
                "--listen-peer-urls", f"http://127.0.0.1:{self.etcd_peer_port}",
                "--initial-advertise-peer-urls", f"http://127.0.0.1:{self.etcd_peer_port}",
                "--initial-cluster", f"tp=http://127.0.0.1:{self.etcd_peer_port}",
            ],
        )  # fmt: skip
        for node in self.nodes:
            self._spawn(node.name, ["patroni", str(self._config(node, free_port()))])
        deadline = time.monotonic() + timeout
        self.primary, self.standby = self._roles(deadline)
        with psycopg.connect(self.primary.dsn("postgres"), autocommit=True) as conn:
            conn.execute(f"CREATE DATABASE {DBNAME}")
            while not conn.execute("SELECT 1 FROM pg_stat_replication WHERE sync_state = 'sync'").fetchone():
                self._check(deadline, "the replica never became synchronous")
                time.sleep(0.2)
        migrate(self.primary.dsn(), progress=lambda _m: None)

    def _check(self, deadline: float, what: str) -> None:
        for name, proc in self.processes.items():
            if proc.poll() is not None:
                said = (self.root / f"{name}.log").read_text()[-2000:]
                raise RuntimeError(f"{name} exited ({proc.returncode}): {said}")
        if time.monotonic() > deadline:
            raise TimeoutError(what)

    def _roles(self, deadline: float) -> tuple[Node, Node]:
        """(leader, replica) once both servers answer: the leader out of recovery, the replica in it."""
        while True:
            recovery = {}
            for node in self.nodes:
                with (
                    contextlib.suppress(psycopg.Error),
                    psycopg.connect(node.dsn("postgres"), connect_timeout=2) as conn,
                ):
                    recovery[node.name] = conn.execute("SELECT pg_is_in_recovery()").fetchone()[0]
            if sorted(recovery.values()) == [False, True]:
                leader = next(n for n in self.nodes if recovery[n.name] is False)
                return leader, next(n for n in self.nodes if n is not leader)
            self._check(deadline, "Patroni never brought up a leader and a replica")
            time.sleep(0.3)

    def kill_primary(self) -> None:
        """The leader's machine dies: SIGKILL to its Patroni, its postmaster and every backend, at once."""
        self.killed_at = kill_machine(self.primary, self.processes[self.primary.name].pid)

    def fail_over(self, down_s: float = 0.0) -> None:
        """Kill the leader; Patroni promotes the replica once the leader key expires (ttl). `down_s` is
        Patroni's to decide here: ignored."""
        with psycopg.connect(self.standby.dsn("postgres"), autocommit=True) as conn:
            self.kill_primary()
            assert self.killed_at is not None
            self.promoted_after, self.promoted_at = wait_primary(conn, self.killed_at)

    def stop(self) -> None:
        for name, proc in self.processes.items():
            if name != "etcd" and proc.poll() is None:
                proc.terminate()  # Patroni stops its PostgreSQL on the way out
        for name, proc in self.processes.items():
            if name != "etcd":
                try:
                    proc.wait(30)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
        for node in self.nodes:  # a postmaster whose Patroni was killed (the old leader's is gone too)
            pid = node.postmaster_pid()
            if pid is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        etcd = self.processes.get("etcd")
        if etcd is not None:
            etcd.kill()
            etcd.wait()


def patroni_cluster() -> contextlib.AbstractContextManager[PatroniCluster]:
    return running(PatroniCluster, "tp-patroni-")
