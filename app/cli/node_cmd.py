"""`tuneplane node` (the agent on each machine) and `tuneplane node-gateway` (the endpoint agents dial)."""

from __future__ import annotations

import asyncio
import socket

import click

from tuneplane.app.cli.options import server_side, settings_from
from tuneplane.app.node_gateway.config import DEFAULT_PORT, ENV_NODE_GATEWAY_URL


@click.command("node")
@click.option(
    "--server",
    envvar=ENV_NODE_GATEWAY_URL,
    required=True,
    help=f"Node gateway URL, https:// (http:// only to loopback) (env {ENV_NODE_GATEWAY_URL}).",
)
@click.option(
    "--enroll-token",
    envvar="TUNEPLANE_ENROLL_TOKEN",
    default=None,
    help="One-time token from `tuneplane fleet enroll-token` (first start only).",
)
@click.option(
    "--state-dir",
    required=True,
    type=click.Path(file_okay=False),
    help="Private directory for the node credential (0700; the credential file is 0600).",
)
@click.option(
    "--work-dir",
    default=None,
    type=click.Path(file_okay=False),
    help="Where workloads get their directories (default: <state-dir>-work next to it).",
)
@click.option("--name", default=None, help="Node name in the fleet (default: the host name).")
@click.option(
    "--simulate-gpus",
    type=click.IntRange(0, 64),
    default=None,
    help="Report N simulated GPUs instead of detecting real ones (tests and benchmarks only).",
)
@click.option(
    "--ca-bundle",
    type=click.Path(dir_okay=False, exists=True),
    default=None,
    help="PEM bundle of a private CA that signed the gateway's certificate.",
)
@click.option(
    "--max-backoff",
    type=float,
    default=30.0,
    show_default=True,
    help="Longest wait between reconnection attempts, in seconds.",
)
@click.option(
    "--telemetry-url",
    envvar="TUNEPLANE_TELEMETRY_URL",
    default=None,
    help="Telemetry gateway for the members' collectors (env TUNEPLANE_TELEMETRY_URL); none: no collector.",
)
@click.option(
    "--probe-port",
    type=click.IntRange(0, 65535),
    default=0,
    show_default=True,
    help="TCP port of the peer-network probe other nodes must reach (0: any free port, reported).",
)
@click.option("--probe-host", default="0.0.0.0", show_default=True, help="Address the probe listens on.")
@click.option(
    "--advertise-address",
    default=None,
    help="Address peers use to reach this node (default: the address the gateway sees).",
)
@click.option(
    "--delivery-deadline",
    type=click.FloatRange(min=1.0),
    default=6 * 3600.0,
    show_default=True,
    help="Seconds after a member ends within which its outputs must be delivered (retried until then); "
    "past it a pending output artifact is marked failed.",
)
@click.option(
    "--standby-runners",
    type=click.IntRange(0, 64),
    default=1,
    show_default=True,
    help="Runner processes kept started ahead of any member, so a START hands its member to one instead of "
    "starting an interpreter (0: start each runner at START).",
)
@click.option("--hold-prepare", type=float, default=0.0, hidden=True)
@click.option("--hold-after-spawn", type=float, default=0.0, hidden=True)
@click.option("--hold-exit-report", type=float, default=0.0, hidden=True)
def node_cmd(
    server: str,
    enroll_token: str | None,
    state_dir: str,
    work_dir: str | None,
    name: str | None,
    simulate_gpus: int | None,
    ca_bundle: str | None,
    max_backoff: float,
    telemetry_url: str | None,
    probe_port: int,
    probe_host: str,
    advertise_address: str | None,
    delivery_deadline: float,
    standby_runners: int,
    hold_prepare: float,
    hold_after_spawn: float,
    hold_exit_report: float,
) -> None:
    """Run the Node agent: enroll once, then keep an outbound control connection to the gateway."""
    from tuneplane.app.cli import ExpectedError
    from tuneplane.workers.agent.main import AgentError, AgentOptions, main

    options = AgentOptions(
        server=server,
        state_dir=state_dir,
        enroll_token=enroll_token,
        work_dir=work_dir,
        name=name,
        simulate_gpus=simulate_gpus,
        ca_bundle=ca_bundle,
        max_backoff=max_backoff,
        telemetry_url=telemetry_url,
        probe_host=probe_host,
        probe_port=probe_port,
        advertise_address=advertise_address,
        delivery_deadline=delivery_deadline,
        standby_runners=standby_runners,
        hold_prepare=hold_prepare,
        hold_after_spawn=hold_after_spawn,
        hold_exit_report=hold_exit_report,
    )
    try:
        main(options)
    except AgentError as exc:
        raise ExpectedError(str(exc)) from exc


@click.command("node-gateway")
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", default=DEFAULT_PORT, show_default=True, type=int)
@click.option(
    "--tls-cert",
    type=click.Path(dir_okay=False, exists=True),
    default=None,
    help="PEM certificate chain; serve HTTPS (agents then need https://).",
)
@click.option("--tls-key", type=click.Path(dir_okay=False, exists=True), default=None)
@click.option("--name", default=None, help="This gateway's name in events (default: host:port).")
@click.option(
    "--poll-interval",
    default=2.0,
    show_default=True,
    type=float,
    help="Seconds between outbox polls (the fallback to LISTEN/NOTIFY).",
)
@click.option("--pool-size", default=8, show_default=True, type=int, help="Database connections.")
@server_side
def node_gateway_cmd(
    host: str,
    port: int,
    tls_cert: str | None,
    tls_key: str | None,
    name: str | None,
    poll_interval: float,
    pool_size: int,
    database_url: str | None,
    data_dir: str | None,
) -> None:
    """Serve the node control gateway that Node agents dial out to."""
    from tuneplane.app.cli import ExpectedError
    from tuneplane.app.migrate import require_current
    from tuneplane.app.node_gateway.server import serve

    settings = settings_from(database_url, data_dir)
    if not settings.database_url:
        raise ExpectedError("tuneplane node-gateway needs --database-url or TUNEPLANE_DATABASE_URL")
    if bool(tls_cert) != bool(tls_key):
        raise ExpectedError("--tls-cert and --tls-key go together")
    require_current(settings.database_url)
    asyncio.run(
        serve(
            settings.database_url,
            host,
            port,
            name=name or f"{socket.gethostname()}:{port}",
            tls_cert=tls_cert,
            tls_key=tls_key,
            poll_interval=poll_interval,
            pool_size=pool_size,
            blob_dir=settings.blob_dir,
        )
    )


COMMANDS = [node_cmd, node_gateway_cmd]
