"""`tuneplane db migrate|status`."""

from __future__ import annotations

import dataclasses

import click

from tuneplane.app import migrate as migrations
from tuneplane.app.cli.options import (
    database,
    json_option,
    print_json,
    print_table,
    server_side,
    settings_from,
)


@click.group("db")
def db_group() -> None:
    """Database schema: apply and inspect migrations."""


@db_group.command("migrate")
@server_side
def migrate_cmd(database_url: str | None, data_dir: str | None) -> None:
    """Apply pending migrations (and install or upgrade pgqueuer's tables)."""
    settings = settings_from(database_url, data_dir)
    with database(settings, progress=click.echo) as url:
        applied = migrations.migrate(url, progress=click.echo)
    click.echo(f"{len(applied)} migration(s) applied" if applied else "schema is up to date")


@db_group.command("status")
@server_side
@json_option
def status_cmd(database_url: str | None, data_dir: str | None, as_json: bool) -> None:
    """List applied and pending migrations and function files (version 0)."""
    settings = settings_from(database_url, data_dir)
    with database(settings) as url:
        rows = [dataclasses.asdict(s) for s in migrations.status(url) + migrations.functions_status(url)]
    if as_json:
        print_json(rows)
    else:
        print_table(rows, ["version", "name", "state", "applied_at"])


COMMANDS = [db_group]
