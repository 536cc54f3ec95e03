"""`tuneplane admin …`: operator commands that talk to the database directly."""

from __future__ import annotations

import secrets

import click

from tuneplane.app import db_functions as fn
from tuneplane.app.cli.options import database, server_side, settings_from
from tuneplane.app.db import Database
from tuneplane.app.security import hash_password, new_token


@click.group("admin")
def admin_group() -> None:
    """Operator commands (direct database access)."""


@admin_group.command("create-user")
@click.argument("username")
@click.option("--role", type=click.Choice(["user", "admin"]), default="user", show_default=True)
@click.option("--password", default=None, help="Default: a random password, printed once.")
@click.option("--with-token", is_flag=True, help="Also issue an API token and print it.")
@server_side
def create_user(
    username: str,
    role: str,
    password: str | None,
    with_token: bool,
    database_url: str | None,
    data_dir: str | None,
) -> None:
    """Create a console user."""
    generated = password is None
    password = password or secrets.token_urlsafe(12)
    with database(settings_from(database_url, data_dir)) as url:
        db = Database(url, max_size=1, name="tuneplane-admin")
        try:
            user = db.call(fn.create_user, username, hash_password(password), role)[0]
            click.echo(f"created {role} {user['username']} (id {user['id']})")
            if generated:
                click.echo(f"password: {password}")
            if with_token:
                plaintext, digest = new_token("tpu")
                db.call(fn.issue_api_token, user["id"], "created by tuneplane admin", digest, None)
                click.echo(f"token: {plaintext}")
        finally:
            db.close()


@admin_group.command("issue-token")
@click.argument("username")
@click.option("--name", default="cli", show_default=True)
@server_side
def issue_token(username: str, name: str, database_url: str | None, data_dir: str | None) -> None:
    """Issue an API token for USERNAME and print it (shown once)."""
    with database(settings_from(database_url, data_dir)) as url:
        db = Database(url, max_size=1, name="tuneplane-admin")
        try:
            row = db.fetch_one("SELECT id FROM users WHERE username = %s", (username,))
            if row is None:
                raise click.ClickException(f"no user named {username}")
            plaintext, digest = new_token("tpu")
            db.call(fn.issue_api_token, row["id"], name, digest, None)
            click.echo(plaintext)
        finally:
            db.close()


COMMANDS = [admin_group]
