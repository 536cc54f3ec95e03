"""Options shared by many commands, and the database a server-side command talks to."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import click

if TYPE_CHECKING:
    from tuneplane.app.settings import Settings


def server_side(func: Callable) -> Callable:
    """--database-url and --data-dir, for commands that talk to the database directly."""
    func = click.option(
        "--data-dir",
        type=click.Path(file_okay=False),
        default=None,
        help="State directory (env TUNEPLANE_DATA_DIR); holds the embedded database.",
    )(func)
    func = click.option(
        "--database-url",
        default=None,
        help="PostgreSQL URL (env TUNEPLANE_DATABASE_URL); without it the embedded database is used.",
    )(func)
    return func


def settings_from(database_url: str | None, data_dir: str | None) -> Settings:
    from tuneplane.app.settings import load_settings  # pydantic: only for the commands that read settings

    return load_settings(database_url=database_url, data_dir=data_dir)


@contextmanager
def database(settings: Settings, progress: Callable[[str], None] | None = None) -> Iterator[str]:
    """The database URL to use; starts the embedded server for the duration if it is not running."""
    if settings.database_url:
        yield settings.database_url
        return
    from tuneplane.app import embedded_pg

    if progress:
        progress(f"using the embedded PostgreSQL in {settings.pgdata}")
    pg = embedded_pg.start(settings.pgdata)
    try:
        yield pg.url
    finally:
        pg.stop()


def client_options(func: Callable) -> Callable:
    """--server, --token and --ca-bundle for client commands (then env, then the config file)."""
    func = click.option(
        "--ca-bundle", default=None, help="CA bundle for a private CA (env TUNEPLANE_CA_BUNDLE)."
    )(func)
    func = click.option("--token", default=None, help="API token (env TUNEPLANE_TOKEN).")(func)
    func = click.option("--server", default=None, help="Server URL (env TUNEPLANE_SERVER).")(func)
    return func


def api_client(server: str | None, token: str | None, ca_bundle: str | None, *, timeout: float = 30.0):
    """The HTTP client for a client command, configured from flags, env and the config file."""
    from tuneplane.app.client.config import resolve
    from tuneplane.app.client.http import ApiClient

    return ApiClient(resolve(server, token, ca_bundle), timeout=timeout)


json_option = click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")


def print_json(data: Any) -> None:
    from tuneplane.app.web.negotiate import _default

    json.dump(data, sys.stdout, default=_default, indent=2)
    sys.stdout.write("\n")


def print_table(rows: list[dict], columns: list[str], empty: str = "(none)") -> None:
    if not rows:
        click.echo(empty)
        return
    cells = [[("" if r.get(c) is None else str(r.get(c))) for c in columns] for r in rows]
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(columns)]
    click.echo("  ".join(c.upper().ljust(w) for c, w in zip(columns, widths, strict=True)).rstrip())
    for row in cells:
        click.echo("  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)).rstrip())
