"""`tuneplane server`: the console and HTTP forms, served by waitress (a production WSGI server)."""

from __future__ import annotations

import click

from tuneplane.app.cli.options import server_side, settings_from
from tuneplane.app.migrate import require_current

# Artifact chunks (tens of MiB) and downloads go through this server: read the socket in 1 MiB steps, not
# waitress's 8 KiB, and buffer up to 16 MiB of a response in memory before spilling it to a temporary file
# (a download streams 1 MiB blocks; with the 1 MiB default every one of them took a detour through disk).
BULK_TRANSFER = {"recv_bytes": 1024 * 1024, "outbuf_overflow": 16 * 1024 * 1024}


@click.command("server")
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", default=8080, show_default=True, type=int)
@click.option("--threads", default=8, show_default=True, type=int)
@click.option(
    "--trusted-proxy",
    default=None,
    help="Address of the TLS-terminating proxy in front: its X-Forwarded-Proto is believed, so requests "
    "that came over HTTPS are seen as such (the session cookie is then Secure).",
)
@server_side
def server_cmd(
    host: str,
    port: int,
    threads: int,
    trusted_proxy: str | None,
    database_url: str | None,
    data_dir: str | None,
) -> None:
    """Serve the web console and the HTTP API (needs TUNEPLANE_DATABASE_URL or --database-url)."""
    settings = settings_from(database_url, data_dir)
    if not settings.database_url:
        raise click.ClickException(
            "tuneplane server needs --database-url or TUNEPLANE_DATABASE_URL (tuneplane up passes it)"
        )
    require_current(settings.database_url)
    import waitress

    from tuneplane.app.web import create_app

    app = create_app(
        settings.database_url, pool_max=threads + 2, config={"TP_DATA_DIR": str(settings.data_dir)}
    )
    click.echo(f"serving on http://{host}:{port}", err=True)
    proxy = (
        {"trusted_proxy": trusted_proxy, "trusted_proxy_headers": {"x-forwarded-proto"}}
        if trusted_proxy
        else {}
    )
    waitress.serve(
        app, host=host, port=port, threads=threads, ident="tuneplane", clear_untrusted_proxy_headers=True,
        **BULK_TRANSFER, **proxy,
    )  # fmt: skip


COMMANDS = [server_cmd]
