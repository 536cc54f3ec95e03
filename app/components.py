"""What `tuneplane up` starts, in order. Each area appends its processes here."""

from __future__ import annotations

import sys
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from tuneplane.app.supervisor import Component


@dataclass(frozen=True)
class UpContext:
    database_url: str
    data_dir: Path
    host: str
    port: int
    # The gateways' ports; None: the console port + 1 (node gateway) and + 2 (telemetry gateway).
    node_gateway_port_: int | None = None
    telemetry_gateway_port_: int | None = None

    @property
    def node_gateway_port(self) -> int:
        return self.node_gateway_port_ if self.node_gateway_port_ is not None else self.port + 1

    @property
    def telemetry_gateway_port(self) -> int:
        return self.telemetry_gateway_port_ if self.telemetry_gateway_port_ is not None else self.port + 2

    @property
    def server_url(self) -> str:
        host = "127.0.0.1" if self.host in ("0.0.0.0", "") else self.host
        return f"http://{host}:{self.port}"

    def env(self) -> dict[str, str]:
        return {"TUNEPLANE_DATABASE_URL": self.database_url, "TUNEPLANE_DATA_DIR": str(self.data_dir)}


def tuneplane_argv(*args: str) -> list[str]:
    return [sys.executable, "-P", "-m", "tuneplane", *args]


def http_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=1) as response:
            return response.status == 200
    except OSError:
        return False


def node_gateway_url(ctx: UpContext) -> str:
    """`tuneplane up` runs the node gateway on the console port + 1 by default (agents dial it)."""
    host = "127.0.0.1" if ctx.host in ("0.0.0.0", "") else ctx.host
    return f"http://{host}:{ctx.node_gateway_port}"


def telemetry_gateway_url(ctx: UpContext) -> str:
    """`tuneplane up` runs the telemetry gateway on the console port + 2 by default."""
    host = "127.0.0.1" if ctx.host in ("0.0.0.0", "") else ctx.host
    return f"http://{host}:{ctx.telemetry_gateway_port}"


def embedded_postgres_component(pgdata: Path, data_dir: Path) -> tuple[Component, Path]:
    """The embedded PostgreSQL as `up`'s first child, and the file it writes its URL to once ready."""
    url_file = data_dir / "run" / "postgres.url"
    url_file.unlink(missing_ok=True)
    component = Component(
        "postgres",
        tuneplane_argv("embedded-postgres", "--pgdata", str(pgdata), "--url-file", str(url_file)),
        ready=url_file.exists,
        ready_timeout=180.0,
        # The database server needs no store key (nor may a superuser's COPY … FROM PROGRAM 'env' see one).
        withhold_env=_server_only_env(),
    )
    return component, url_file


def _server_only_env() -> tuple[str, ...]:
    """The S3 store's keys: only the console server, the node gateway and the worker use them (issue 32)."""
    from tuneplane.app.s3store import SERVER_ONLY_ENV

    return SERVER_ONLY_ENV


def up_components(ctx: UpContext) -> list[Component]:
    from tuneplane.app.node_gateway.local import node_components

    return [
        Component(
            "server",
            tuneplane_argv("server", "--host", ctx.host, "--port", str(ctx.port)),
            # The Fleet page shows agents where to dial (the node gateway, console port + 1).
            env={**ctx.env(), "TUNEPLANE_NODE_GATEWAY_URL": node_gateway_url(ctx)},
            ready=lambda: http_ok(f"{ctx.server_url}/healthz"),
        ),
        Component(
            "telemetry-gateway",
            tuneplane_argv(
                "telemetry-gateway", "--host", ctx.host, "--port", str(ctx.telemetry_gateway_port)
            ),
            env=ctx.env(),
            ready=lambda: http_ok(f"{telemetry_gateway_url(ctx)}/healthz"),
            withhold_env=_server_only_env(),  # it stores metrics and never touches artifact bytes
        ),
        *node_components(ctx),
        # Places queued jobs, builds capsules and sends PREPARE (several may run; one is enough here).
        Component(
            "worker",
            tuneplane_argv("worker", "--backend", "node"),
            env=ctx.env(),
            # Written once it is connected and consuming (after a database restart too).
            ready_line="consuming `launch`",
            ready_timeout=180.0,
        ),
    ]
