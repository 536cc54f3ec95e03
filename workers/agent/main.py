"""`tuneplane node`: enroll once, then keep one outbound control session alive (backoff with jitter).

Transport rules: https:// with verification always on (`--ca-bundle` adds a private CA; nothing turns
verification off), plain http:// only to a loopback address.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import re
import signal
import socket
import ssl
import time
from dataclasses import dataclass
from urllib.parse import urlsplit

import aiohttp

from tuneplane.app import __version__
from tuneplane.app.client.http import ClientError, check_transport
from tuneplane.app.client.transport import retry_after
from tuneplane.workers.agent import capacity as capacity_probe
from tuneplane.workers.agent.credential import FileCredentialStore
from tuneplane.workers.agent.directories import AgentPaths, StateError
from tuneplane.workers.agent.handlers import AgentContext
from tuneplane.workers.agent.session import ControlSession, Refused, Unavailable, enroll
from tuneplane.workers.agent.workload_dir_check import check_workload_dirs

# Modules that register more command handlers (the launch issue adds its own here).
HANDLER_MODULES: list[str] = ["tuneplane.workers.agent.launch", "tuneplane.workers.agent.preemption"]


class AgentError(Exception):
    """Fatal for the agent: printed as one line, exit status 1."""


@dataclass(frozen=True)
class AgentOptions:
    server: str
    state_dir: str
    enroll_token: str | None = None
    work_dir: str | None = None
    name: str | None = None
    simulate_gpus: int | None = None
    ca_bundle: str | None = None
    max_backoff: float = 30.0
    # Launch: where members' collectors ship telemetry (none: members run without a collector), and the
    # peer-network probe (bind host, port 0 = any free one, the address peers should dial).
    telemetry_url: str | None = None
    probe_host: str = "0.0.0.0"
    probe_port: int = 0
    advertise_address: str | None = None
    # Seconds after a member's end within which its outputs are delivered (retried until then).
    delivery_deadline: float = 6 * 3600.0
    # Runners started ahead of any member (workers/agent/standby_runners.py).
    standby_runners: int = 1
    # Tests only: keep every PREPARE in flight this long (a slow, cold preparation); wait this long
    # between spawning a runner and recording it (a crash in that window); wait this long between a
    # member's end record and its exit report (a reconnect or crash in that window).
    hold_prepare: float = 0.0
    hold_after_spawn: float = 0.0
    hold_exit_report: float = 0.0


def default_node_name() -> str:
    name = re.sub(r"[^A-Za-z0-9_.-]", "-", socket.gethostname().split(".")[0])[:63].strip("-._")
    return name or "node"


def client_ssl(server: str, ca_bundle: str | None) -> ssl.SSLContext | bool:
    """Verification on, always. With --ca-bundle, that bundle is the trust store (a private CA)."""
    if urlsplit(server).scheme != "https":
        if ca_bundle:
            raise AgentError("--ca-bundle is for https:// servers")
        return False  # plain http to loopback only (checked by check_transport)
    try:
        return ssl.create_default_context(cafile=ca_bundle) if ca_bundle else ssl.create_default_context()
    except (OSError, ssl.SSLError) as exc:
        raise AgentError(f"cannot use CA bundle {ca_bundle}: {exc}") from exc


def backoff_delay(attempt: int, maximum: float, base: float = 0.5) -> float:
    """Exponential backoff with jitter (half to full of the cap), so a fleet does not reconnect in step."""
    cap = min(maximum, base * (2 ** min(attempt, 16)))
    return random.uniform(cap / 2, cap)


def reconnect_delay(exc: BaseException | None, attempt: int, maximum: float) -> float:
    """The pause before the next try. A gateway that answered 503 (its database away: a restart, a
    failover) said when to come back (Retry-After): that long, up to a quarter more so that a fleet does not
    come back in step, and no exponential growth (the gateway is there; the failover takes seconds).
    Anything else: exponential backoff with jitter."""
    asked = None
    if isinstance(exc, Unavailable):
        asked = exc.retry_after
    elif isinstance(exc, aiohttp.ClientResponseError) and exc.headers is not None:
        asked = retry_after(exc.status, exc.headers.get("Retry-After"))
    if asked is None:
        return backoff_delay(attempt, maximum)
    return max(asked, 0.1) * random.uniform(1.0, 1.25)


def _tls_failure(exc: BaseException) -> bool:
    return isinstance(exc, aiohttp.ClientConnectorCertificateError | aiohttp.ClientSSLError | ssl.SSLError)


async def run_agent(options: AgentOptions, *, say=print) -> None:
    import importlib

    for module in HANDLER_MODULES:
        importlib.import_module(module)
    try:
        check_transport(options.server)
    except ClientError as exc:
        raise AgentError(exc.message) from exc
    try:
        paths = AgentPaths.prepare(options.state_dir, options.work_dir)
        workload_dirs = check_workload_dirs(paths)
        store = FileCredentialStore(paths.credential_path)
        stored = store.load()
    except StateError as exc:
        raise AgentError(str(exc)) from exc
    ssl_setting = client_ssl(options.server, options.ca_bundle)
    connector = aiohttp.TCPConnector(limit=0, ssl=ssl_setting)
    async with aiohttp.ClientSession(connector=connector) as http:
        if stored is None:
            stored = await _enroll(http, options, store, say)
        elif options.enroll_token:
            say(f"already enrolled as node {stored.fleet}/{stored.node}; --enroll-token ignored")
        ctx = AgentContext(paths=paths)
        ctx.extra["workload_dirs"] = workload_dirs
        ctx.extra.update(
            server=options.server,
            http=http,
            credential_store=store,
            ca_bundle=options.ca_bundle,
            telemetry_url=options.telemetry_url,
            simulated_gpus=options.simulate_gpus is not None,
            probe={
                "host": options.probe_host,
                "port": options.probe_port,
                "advertise_address": options.advertise_address,
            },
            say=say,
            hold_prepare=options.hold_prepare,
            hold_after_spawn=options.hold_after_spawn,
            hold_exit_report=options.hold_exit_report,
            delivery_deadline=options.delivery_deadline,
            standby_runners=options.standby_runners,
        )

        def probe() -> dict:
            found, problem = capacity_probe.detect(options.simulate_gpus, __version__)
            return {**found, "_problem": problem}

        attempt = 0
        while True:
            session = ControlSession(http, options.server, store, ctx, probe, say=say)
            started = time.monotonic()
            failure: BaseException | None = None
            try:
                reason = await session.run()
            except Refused as exc:
                raise AgentError(
                    f"the gateway refused node {stored.fleet}/{stored.node}: {exc.message}"
                ) from exc
            except Exception as exc:
                if _tls_failure(exc):
                    raise AgentError(
                        f"TLS verification of {options.server} failed ({exc}); for a private CA pass "
                        "--ca-bundle PEM (verification is never switched off)"
                    ) from exc
                if not isinstance(
                    exc, aiohttp.ClientError | OSError | asyncio.TimeoutError | ConnectionError
                ):
                    raise
                reason, failure = f"{type(exc).__name__}: {exc}", exc
            if time.monotonic() - started > 30:
                attempt = 0
            delay = reconnect_delay(failure, attempt, options.max_backoff)
            attempt += 1
            say(f"disconnected ({reason}); reconnecting in {delay:.1f}s")
            await asyncio.sleep(delay)


async def _enroll(http: aiohttp.ClientSession, options: AgentOptions, store: FileCredentialStore, say):
    if not options.enroll_token:
        raise AgentError(
            f"this node is not enrolled yet ({store.path} does not exist): pass --enroll-token "
            "(from `tuneplane fleet enroll-token FLEET`)"
        )
    name = options.name or default_node_name()
    attempt = 0
    while True:
        try:
            stored = await enroll(http, options.server, options.enroll_token, name, socket.gethostname())
            break
        except Refused as exc:
            raise AgentError(exc.message) from exc
        except Exception as exc:
            if _tls_failure(exc):
                raise AgentError(
                    f"TLS verification of {options.server} failed ({exc}); for a private CA pass "
                    "--ca-bundle PEM (verification is never switched off)"
                ) from exc
            if not isinstance(exc, aiohttp.ClientError | OSError | asyncio.TimeoutError):
                raise
            delay = reconnect_delay(exc, attempt, options.max_backoff)
            attempt += 1
            say(f"cannot reach {options.server} to enroll ({exc}); retrying in {delay:.1f}s")
            await asyncio.sleep(delay)
    store.save(stored)
    say(f"enrolled as node {stored.fleet}/{stored.node} (id {stored.node_id}); credential in {store.path}")
    return stored


def main(options: AgentOptions) -> None:
    """Run until SIGTERM/SIGINT; AgentError leaves as the caller's one-line error."""

    async def runner() -> None:
        task = asyncio.current_task()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(NotImplementedError):
                loop.add_signal_handler(sig, task.cancel)
        with contextlib.suppress(asyncio.CancelledError):
            await run_agent(options, say=lambda line: print(line, flush=True))

    asyncio.run(runner())
