"""`tuneplane db migrate|status|schema`."""

from __future__ import annotations

import dataclasses
from pathlib import Path

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


@db_group.command("schema")
@click.option(
    "--database-url",
    default=None,
    help="A PostgreSQL server to use (a temporary database is created and dropped there); "
    "without it a throw-away embedded server is started.",
)
@click.option(
    "--output",
    type=click.Path(dir_okay=False),
    default=None,
    help="Where to write (default: sql/schema.sql of this checkout); '-' prints it.",
)
def schema_cmd(database_url: str | None, output: str | None) -> None:
    """Regenerate sql/schema.sql: an empty database after every migration (app/schema_dump.py)."""
    from tuneplane.app import schema_dump
    from tuneplane.app.resources import resource_dir

    text = schema_dump.fresh_schema(database_url)
    if output == "-":
        click.echo(text, nl=False)
        return
    target = Path(output) if output else resource_dir("sql") / "schema.sql"
    target.write_text(text)
    click.echo(f"wrote {target} ({len(text.splitlines())} lines)")


COMMANDS = [db_group]
