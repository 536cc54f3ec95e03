"""How many idle agents one node gateway process holds, and how fast a command reaches an agent.

    .venv/bin/python bench/gateway_agents.py [--agents 10000] [--database-url URL]

One gateway process (`tuneplane node-gateway`, loopback only) and, in this process, N simulated agents
(the real workers.agent ControlSession, asyncio, one WebSocket each, real heartbeats at the configured
interval). Measures:
  * agents held: sessions the gateway reports, the time to connect them, gateway and client memory;
  * delivery delay = agent receipt - the moment just before `enqueue_node_command` was called (so it
    includes the INSERT's commit, the NOTIFY, the gateway's claim and the WebSocket hop), p50/p99, for a
    single connected agent and then with all N connected;
  * that heartbeats do not NOTIFY: a LISTEN on the command channel hears nothing while N agents heartbeat.
Prints ratios against the 1 s p99 target. Everything is bounded by --max-seconds; it stops by itself.
Without --database-url it starts an embedded PostgreSQL in a temporary directory and removes it after.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json
import os
import random
import resource
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
import psycopg
from psycopg.types.json import Jsonb

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tuneplane.app.db import SEARCH_PATH_OPTION  # noqa: E402
from tuneplane.app.migrate import migrate  # noqa: E402
from tuneplane.app.security import new_token  # noqa: E402
from tuneplane.workers.agent.credential import MemoryCredentialStore, StoredCredential  # noqa: E402
from tuneplane.workers.agent.handlers import COMMAND_HANDLERS, AgentContext  # noqa: E402
from tuneplane.workers.agent.session import ControlSession  # noqa: E402

TARGET_P99 = 1.0
received: dict[int, float] = {}


async def bench_ping(_ctx: AgentContext, payload: dict) -> dict:
    received[payload["seq"]] = time.time() - payload["t"]
    return {"ok": True}


COMMAND_HANDLERS["bench.ping"] = bench_ping


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rss_mib(pid: int) -> float:
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def enroll_nodes(url: str, count: int) -> list[StoredCredential]:
    """Fleet `bench` and `count` enrolled nodes, through the same stored functions the gateway uses."""
    credentials = []
    with psycopg.connect(url, options=SEARCH_PATH_OPTION) as conn:
        conn.execute("SELECT create_fleet('bench', 'node')")
        rows = []
        for i in range(count):
            _token, token_digest = new_token("tpe")
            credential, credential_digest = new_token("tpn")
            rows.append((token_digest, f"agent-{i:05d}", credential_digest, credential))
        with conn.cursor() as cur:
            cur.executemany(
                "SELECT create_enrollment_token('bench', %s, interval '1 hour', 'bench')",
                [(r[0],) for r in rows],
            )
            cur.executemany("SELECT enroll_node(%s, %s, %s, '127.0.0.1')", [r[:3] for r in rows])
        conn.commit()
        ids = dict(conn.execute("SELECT name, id FROM nodes").fetchall())
    for _token, name, _digest, credential in rows:
        credentials.append(StoredCredential(ids[name], name, "bench", credential))
    return credentials


class Agents:
    def __init__(self, server: str) -> None:
        self.server = server
        self.http: aiohttp.ClientSession | None = None
        self.sessions: dict[int, ControlSession] = {}
        self.tasks: list[asyncio.Task] = []
        self.failures = 0

    async def __aenter__(self) -> Agents:
        self.http = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0))
        return self

    async def __aexit__(self, *exc: object) -> None:
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        assert self.http is not None
        await self.http.close()

    async def _run(self, credential: StoredCredential, session: ControlSession) -> None:
        try:
            await session.run()
        except Exception:
            self.failures += 1

    async def connect(self, credentials: list[StoredCredential], concurrency: int, deadline: float) -> int:
        capacity = {
            "cpus": 8,
            "memory_bytes": 64 << 30,
            "gpus": [],
            "agent_version": "bench",
            "container_runtimes": [],
            "hostname": "bench",
        }
        gate = asyncio.Semaphore(concurrency)

        async def one(credential: StoredCredential) -> None:
            async with gate:
                session = ControlSession(
                    self.http,
                    self.server,
                    MemoryCredentialStore(credential),
                    AgentContext(),
                    lambda: dict(capacity),
                    say=lambda _m: None,
                )
                self.sessions[credential.node_id] = session
                self.tasks.append(asyncio.create_task(self._run(credential, session)))
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(session.connected.wait(), max(1.0, deadline - time.monotonic()))

        await asyncio.gather(*(one(c) for c in credentials))
        return sum(1 for s in self.sessions.values() if s.connected.is_set())


async def measure_delivery(
    url: str, node_ids: list[int], count: int, rate: float, deadline: float, seq_start: int
) -> tuple[list[float], int]:
    """Send `count` commands at `rate`/s to random nodes; the delays that arrived before the deadline."""
    conn = await psycopg.AsyncConnection.connect(url, autocommit=True, options=SEARCH_PATH_OPTION)
    async with conn:
        for i in range(count):
            if time.monotonic() > deadline:
                break
            seq = seq_start + i
            node = random.choice(node_ids)
            payload = {"seq": seq, "t": time.time()}
            await conn.execute(
                "SELECT enqueue_node_command(%s, 'bench.ping', %s, 'bench')", (node, Jsonb(payload))
            )
            await asyncio.sleep(1 / rate)
        sent = i + 1
        wait_until = min(deadline, time.monotonic() + 10)
        while time.monotonic() < wait_until and sum(1 for s in received if s >= seq_start) < sent:
            await asyncio.sleep(0.05)
    return [d for s, d in received.items() if seq_start <= s < seq_start + sent], sent


async def listen_for_notifies(url: str, seconds: float) -> int:
    conn = await psycopg.AsyncConnection.connect(url, autocommit=True)
    async with conn:
        await conn.execute("LISTEN tuneplane_node_commands")
        heard = 0
        with contextlib.suppress(asyncio.TimeoutError):
            async with asyncio.timeout(seconds):
                async for _n in conn.notifies():
                    heard += 1
        return heard


async def gateway_health(http: aiohttp.ClientSession, server: str, reset: bool = False) -> dict:
    async with http.get(f"{server}/v1/stats", params={"reset": "1"} if reset else None) as response:
        return await response.json()


def summary(label: str, delays: list[float], sent: int) -> dict:
    if not delays:
        return {"label": label, "sent": sent, "received": 0}
    return {
        "label": label,
        "sent": sent,
        "received": len(delays),
        "p50_ms": pct(delays, 0.5) * 1000,
        "p99_ms": pct(delays, 0.99) * 1000,
        "max_ms": max(delays) * 1000,
        "mean_ms": statistics.fmean(delays) * 1000,
    }


async def run(args: argparse.Namespace, url: str) -> dict:
    start = time.monotonic()
    deadline = start + args.max_seconds
    results: dict = {"agents_requested": args.agents}
    t = time.monotonic()
    credentials = enroll_nodes(url, args.agents)
    results["enroll_s"] = round(time.monotonic() - t, 1)
    port = free_port()
    server = f"http://127.0.0.1:{port}"
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    gateway = subprocess.Popen(
        [
            sys.executable,
            "-P",
            "-m",
            "tuneplane",
            "node-gateway",
            "--database-url",
            url,
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--name",
            "bench-gateway",
        ],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        line = gateway.stdout.readline().decode()
        if "listening" not in line:
            raise SystemExit(f"gateway did not start: {line}{gateway.stdout.read().decode()[-2000:]}")
        client_lag = {"max": 0.0}

        async def watch_lag() -> None:
            loop = asyncio.get_running_loop()
            while True:
                before = loop.time()
                await asyncio.sleep(0.1)
                client_lag["max"] = max(client_lag["max"], loop.time() - before - 0.1)

        lag_task = asyncio.create_task(watch_lag())
        gc_full = {"max": 0.0, "started": 0.0}

        def gc_timer(phase: str, info: dict) -> None:
            if info.get("generation") == 2:
                if phase == "start":
                    gc_full["started"] = time.perf_counter()
                else:
                    gc_full["max"] = max(gc_full["max"], time.perf_counter() - gc_full["started"])

        gc.callbacks.append(gc_timer)
        async with Agents(server) as agents:
            # 1) One agent alone.
            await agents.connect(credentials[:1], 1, deadline)
            single, sent = await measure_delivery(
                url, [credentials[0].node_id], args.single_commands, args.rate, deadline, 0
            )
            results["single"] = summary("1 agent", single, sent)
            # 2) All of them.
            t = time.monotonic()
            held = await agents.connect(
                credentials[1:], args.concurrency, min(deadline, t + args.connect_seconds)
            )
            results["connect_s"] = round(time.monotonic() - t, 1)
            health = await gateway_health(agents.http, server)
            results["agents_connected"] = held
            results["gateway_sessions"] = health["sessions"]
            # 3) Idle: heartbeats flow, nothing else; a LISTEN must hear nothing.
            before = health["heartbeats_written"]
            results["notifies_during_idle"] = await listen_for_notifies(url, args.idle_seconds)
            health = await gateway_health(agents.http, server)
            results["heartbeats_written_during_idle"] = health["heartbeats_written"] - before
            results["heartbeat_flushes"] = health["heartbeat_flushes"]
            results["gateway_rss_mib"] = round(rss_mib(gateway.pid), 1)
            results["client_rss_mib"] = round(rss_mib(os.getpid()), 1)
            # 4) Commands to random agents while all are connected.
            ids = [node_id for node_id, s in agents.sessions.items() if s.connected.is_set()]
            # The simulated agents are a benchmark artifact (one process for 10,000 machines): freeze what
            # they allocated so the client's own full collections do not show up as delivery delay.
            gc.collect()
            gc.freeze()
            results["gateway_connect_phase"] = {
                k: v
                for k, v in (await gateway_health(agents.http, server, reset=True)).items()
                if k.endswith("_ms")
            }
            client_lag["max"] = 0.0
            gc_full["max"] = 0.0
            many, sent = await measure_delivery(url, ids, args.commands, args.rate, deadline, 1_000_000)
            results["many"] = summary(f"{len(ids)} agents", many, sent)
            health = await gateway_health(agents.http, server)
            results["gateway_sessions_at_end"] = health["sessions"]
            results["gateway_command_phase"] = {k: v for k, v in health.items() if k.endswith("_ms")}
            results["client_loop_lag_max_ms"] = round(client_lag["max"] * 1000, 1)
            results["client_gc_full_max_ms"] = round(gc_full["max"] * 1000, 1)
            slow = sorted((s, d) for s, d in received.items() if s >= 1_000_000 and d > 1.0)
            results["slow_commands"] = [(s - 1_000_000, round(d, 2)) for s, d in slow[:40]]
            results["agent_session_failures"] = agents.failures
        lag_task.cancel()
    finally:
        gateway.terminate()
        try:
            gateway.wait(15)
        except subprocess.TimeoutExpired:
            gateway.kill()
    results["total_s"] = round(time.monotonic() - start, 1)
    return results


def report(results: dict) -> None:
    print(json.dumps(results, indent=2))
    print()
    print(
        f"agents held by one gateway process: {results.get('gateway_sessions')} of "
        f"{results['agents_requested']} requested (connected in {results.get('connect_s')} s; gateway RSS "
        f"{results.get('gateway_rss_mib')} MiB; ulimit -n {results.get('nofile')})"
    )
    print(
        f"NOTIFYs heard while agents heartbeat: {results.get('notifies_during_idle')} "
        f"({results.get('heartbeats_written_during_idle')} heartbeats written in "
        f"{results.get('idle_seconds')} s)"
    )
    for key in ("single", "many"):
        row = results.get(key) or {}
        if row.get("received"):
            ratio = row["p99_ms"] / 1000 / TARGET_P99
            print(
                f"delivery with {row['label']:>12}: p50 {row['p50_ms']:7.1f} ms  p99 {row['p99_ms']:7.1f} ms "
                f"({row['received']}/{row['sent']} received)  p99/target = {ratio:.3f}"
            )
    if results.get("single", {}).get("received") and results.get("many", {}).get("received"):
        print(
            f"many/single ratio: p50 {results['many']['p50_ms'] / results['single']['p50_ms']:.2f}x, "
            f"p99 {results['many']['p99_ms'] / results['single']['p99_ms']:.2f}x"
        )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--agents", type=int, default=10_000)
    parser.add_argument("--commands", type=int, default=1000, help="commands sent with all agents connected")
    parser.add_argument("--single-commands", type=int, default=200)
    parser.add_argument("--rate", type=float, default=50.0, help="commands per second")
    parser.add_argument("--concurrency", type=int, default=200, help="agents connecting at once")
    parser.add_argument("--connect-seconds", type=float, default=240.0)
    parser.add_argument("--idle-seconds", type=float, default=15.0)
    parser.add_argument("--max-seconds", type=float, default=480.0, help="hard bound on the whole run")
    parser.add_argument("--database-url", default=None, help="default: an embedded PostgreSQL in a temp dir")
    args = parser.parse_args()

    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    with contextlib.suppress(ValueError, OSError):
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    nofile = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    if args.agents + 500 > nofile:
        print(f"ulimit -n is {nofile}: at most ~{nofile - 500} agents fit in this process", file=sys.stderr)
        args.agents = max(1, nofile - 500)

    tmp = None
    pg = None
    url = args.database_url
    if url is None:
        from tuneplane.app import embedded_pg

        tmp = Path(tempfile.mkdtemp(prefix="tp-bench-"))
        pg = embedded_pg.start(tmp / "pg")
        url = pg.url
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("CREATE DATABASE tp_bench")
        url = psycopg.conninfo.make_conninfo(url, dbname="tp_bench")
    try:
        migrate(url, progress=lambda _m: None)
        results = asyncio.run(run(args, url))
        results["nofile"] = nofile
        results["idle_seconds"] = args.idle_seconds
        results["cpus"] = os.cpu_count()
        report(results)
    finally:
        if pg is not None:
            pg.stop()
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
