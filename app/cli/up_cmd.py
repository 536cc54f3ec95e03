"""`tuneplane up`: the embedded default: database, migrations, first admin, and every component."""

from __future__ import annotations

import os
import re
import secrets
import sys
from pathlib import Path

import click

from tuneplane.app import db_functions as fn
from tuneplane.app import migrate, webhook_targets
from tuneplane.app.cli.options import server_side, settings_from
from tuneplane.app.cli.up_ports import check_ports_free
from tuneplane.app.client.config import config_path, read_config_file, write_config_file
from tuneplane.app.components import (
    UpContext,
    embedded_postgres_component,
    node_gateway_url,
    telemetry_gateway_url,
    up_components,
)
from tuneplane.app.db import Database
from tuneplane.app.security import hash_password, new_token
from tuneplane.app.supervisor import ComponentFailed, Supervisor


def _say(message: str) -> None:
    click.echo(f"tuneplane up: {message}", err=True)


def _migrate(url: str) -> None:
    """Migrate, saying one line for the migrations (a fresh install applies dozens) and each other step."""
    applied = migrate.migrate(url, progress=_progress)
    files = [name for name in applied if _MIGRATION_FILE.match(name)]
    if files:
        _say(f"applied {len(files)} migration(s): {files[0]} … {files[-1]}" if len(files) > 1
             else f"applied {files[0]}")  # fmt: skip


def _progress(message: str) -> None:
    if _MIGRATION_LINE.match(message):
        return  # summed up in one line once every migration is applied
    functions = _FUNCTIONS_LINE.match(message)
    count = functions["files"].count(",") + 1 if functions else 0
    if count > 3:  # a fresh install lists every file
        message = f"applying the stored functions ({count} files of sql/functions)"
    _say(message)


_MIGRATION_FILE = re.compile(r"^\d{4}_.*\.sql$")
_MIGRATION_LINE = re.compile(r"^applying \d{4}_.*\.sql$")
_FUNCTIONS_LINE = re.compile(r"^applying function files \((?P<files>.*) changed\)$")


def _first_admin(db: Database, ctx: UpContext) -> tuple[str, str] | None:
    """Create the first admin on an empty installation; returns (username, password) when created."""
    password = secrets.token_urlsafe(12)
    rows = db.call(fn.create_first_admin, "admin", hash_password(password))
    if not rows or rows[0]["id"] is None:
        return None
    secret_file = ctx.data_dir / "initial-admin.txt"
    fd = os.open(secret_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(f"username: admin\npassword: {password}\n")
    return "admin", password


def _write_cli_config(db: Database, ctx: UpContext) -> None:
    """Point the CLI at this server with an admin token, unless the config points to another server."""
    current = read_config_file()
    if current.get("server") and current["server"] != ctx.server_url:
        _say(f"{config_path()} points to {current['server']}; left unchanged")
        return
    if current.get("server") == ctx.server_url and current.get("token"):
        return
    admin = db.fetch_one("SELECT id FROM users WHERE role = 'admin' ORDER BY id LIMIT 1")
    plaintext, digest = new_token("tpu")
    db.call(fn.issue_api_token, admin["id"], "tuneplane up (local admin)", digest, None)
    path = write_config_file({**current, "server": ctx.server_url, "token": plaintext})
    _say(f"wrote the server URL and an admin API token to {path}")


@click.command("up")
@click.option("--host", default="127.0.0.1", show_default=True, help="Address the console listens on.")
@click.option("--port", default=8080, show_default=True, type=int, help="The console's port.")
@click.option(
    "--node-gateway-port", type=int, help="The node gateway's port (agents dial it).  [default: --port + 1]"
)
@click.option(
    "--telemetry-gateway-port", type=int, help="The telemetry gateway's port.  [default: --port + 2]"
)
@click.option(
    "--webhook-allow",
    envvar="TUNEPLANE_WEBHOOK_ALLOW",
    default="",
    help="Team webhooks may reach these hosts/CIDRs, comma-separated (e.g. 127.0.0.1,10.20.0.0/16,"
    "hooks.internal), besides public addresses; plain http:// only to these.  [env: TUNEPLANE_WEBHOOK_ALLOW]",
)
@server_side
def up_cmd(
    host: str,
    port: int,
    node_gateway_port: int | None,
    telemetry_gateway_port: int | None,
    webhook_allow: str,
    database_url: str | None,
    data_dir: str | None,
) -> None:
    """Run TunePlane on this machine (embedded PostgreSQL unless a database URL is given)."""
    try:
        webhook_targets.Policy.parse(webhook_allow)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--webhook-allow") from None
    # The console (registration) and the workers (every connect) apply it: both inherit it from here.
    os.environ[webhook_targets.ENV_ALLOW] = webhook_allow
    ports = UpContext("", Path(), host, port, node_gateway_port, telemetry_gateway_port)
    check_ports_free(
        host,
        {
            "console": port,
            "node gateway": ports.node_gateway_port,
            "telemetry gateway": ports.telemetry_gateway_port,
        },
    )
    settings = settings_from(database_url, data_dir)
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    supervisor = Supervisor(settings.log_dir, _say)
    supervisor.install_signal_handlers()

    url = settings.database_url
    exit_code = 1
    try:
        if url is None:
            # The embedded PostgreSQL is a supervised child like the others (restarted if it dies) and
            # the last one stopped.
            _say(f"starting the embedded PostgreSQL in {settings.pgdata}")
            component, url_file = embedded_postgres_component(settings.pgdata, settings.data_dir)
            supervisor.start(component)
            if supervisor.stop_requested.is_set():
                raise ComponentFailed("stopped while PostgreSQL was starting")
            url = url_file.read_text().strip()
        _migrate(url)
        ctx = UpContext(url, settings.data_dir, host, port, node_gateway_port, telemetry_gateway_port)
        db = Database(url, max_size=2, name="tuneplane-up")
        try:
            admin = _first_admin(db, ctx)
            _write_cli_config(db, ctx)
        finally:
            db.close()
        for component in up_components(ctx):
            if supervisor.stop_requested.is_set():
                break
            supervisor.start(component)
        if not supervisor.stop_requested.is_set():
            click.echo(f"TunePlane is up: {ctx.server_url}")
            click.echo(
                f"node gateway: {node_gateway_url(ctx)} (agents dial it); "
                f"telemetry gateway: {telemetry_gateway_url(ctx)}"
            )
            secret_file = ctx.data_dir / "initial-admin.txt"
            if admin:
                click.echo(f"admin login: {admin[0]} / {admin[1]} (also in {secret_file})")
            elif secret_file.exists():  # a restart: the password is not shown again, but where it is
                click.echo(f"admin login: see {secret_file}")
            click.echo("press Ctrl-C to stop", err=True)
            sys.stdout.flush()
        exit_code = supervisor.watch()
    except ComponentFailed as exc:
        _say(str(exc))
    finally:
        supervisor.stop_all()
    _say("stopped")
    sys.exit(exit_code)


@click.command("embedded-postgres", hidden=True)
@click.option("--pgdata", required=True, type=click.Path(file_okay=False))
@click.option("--url-file", required=True, type=click.Path(dir_okay=False))
def embedded_postgres_cmd(pgdata: str, url_file: str) -> None:
    """The embedded PostgreSQL as a child of `tuneplane up` (started, watched and stopped by it)."""
    from pathlib import Path

    from tuneplane.app import embedded_pg

    sys.exit(embedded_pg.serve(Path(pgdata), Path(url_file), say=lambda line: click.echo(line)))


COMMANDS = [up_cmd, embedded_postgres_cmd]
