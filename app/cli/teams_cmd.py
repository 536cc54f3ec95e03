"""`tuneplane token …` and `tuneplane teams …`: scoped API tokens and teams, through the server's HTTP API.

Client commands (--server/--token, env, config file): the same endpoints and the same checks as the
console; the rules (roles, token scopes, quota sums) are the stored functions' (docs/teams.md).
"""

from __future__ import annotations

import click

from tuneplane.app import humanize
from tuneplane.app.cli.options import api_client, client_options, json_option, print_json, print_table


@click.group("token")
def token_group() -> None:
    """Your API tokens: make one narrowed to teams and/or read-only, list them, revoke one."""


@token_group.command("create")
@click.option("--name", default="api", show_default=True, help="A name to tell the token apart.")
@click.option("--team", "teams", multiple=True, help="Only this team (repeatable; default: all your teams).")
@click.option("--read-only", is_flag=True, help="The token may only read (no preview, confirm, cancel).")
@click.option("--ttl", default=None, help="Lifetime: 15m, 1h, 7d (1 minute to 365 days; default: no expiry).")
@json_option
@client_options
def token_create(
    name: str,
    teams: tuple[str, ...],
    read_only: bool,
    ttl: str | None,
    as_json: bool,
    server,
    token,
    ca_bundle,
) -> None:
    """Make an API token for yourself; printed once, stored only hashed."""
    body = {"name": name, "teams": list(teams), "read_only": read_only, "ttl": ttl}
    with api_client(server, token, ca_bundle) as api:
        data = api.post("/tokens", json=body)
    if as_json:
        print_json(data)
        return
    click.echo(data["token"])
    scope = ", ".join(data["teams"]) if data["teams"] else "all your teams"
    access = "read-only" if data["read_only"] else "read and act"
    click.echo(f"token {data['token_id']} ({data['name']}): {scope}, {access}; shown once", err=True)


@token_group.command("list")
@json_option
@client_options
def token_list(as_json: bool, server, token, ca_bundle) -> None:
    """Your tokens with their scope and last use."""
    with api_client(server, token, ca_bundle) as api:
        rows = api.get("/tokens")
    if as_json:
        print_json(rows)
        return
    print_table(
        [
            {
                "id": r["id"],
                "name": r["name"],
                "teams": ", ".join(r["teams"]) or "all",
                "access": "read-only" if r["read_only"] else "read+act",
                "last_used": humanize.ago(r["last_used_at"]) if r["last_used_at"] else "never",
                "expires": humanize.ago(r["expires_at"]) if r["expires_at"] else "never",
                "state": "revoked" if r["revoked_at"] else "live",
            }
            for r in rows
        ],
        ["id", "name", "teams", "access", "last_used", "expires", "state"],
        empty="no tokens",
    )


@token_group.command("revoke")
@click.argument("token_id", type=int)
@client_options
def token_revoke(token_id: int, server, token, ca_bundle) -> None:
    """Revoke one of your tokens."""
    with api_client(server, token, ca_bundle) as api:
        api.post(f"/tokens/{token_id}/revoke", json={})
    click.echo(f"token {token_id} revoked")


@click.group("teams")
def teams_group() -> None:
    """Teams: what their members may use (more subcommands join this group)."""


@teams_group.command("priority")
@click.argument("team")
@click.option("--max", "max_class", default=None, help="The highest class to allow (high, urgent).")
@click.option("--fleet", default=None, help="Only on this fleet (default: every fleet).")
@click.option("--remove", is_flag=True, help="Remove the grant (for --fleet, or the every-fleet one).")
@json_option
@client_options
def teams_priority(
    team: str, max_class: str | None, fleet: str | None, remove: bool, as_json: bool, server, token, ca_bundle
) -> None:
    """Show or grant the highest priority class TEAM's members may use (granting: installation admins).

    Without --max or --remove it lists the team's grants (no grant: up to normal on every fleet)."""
    from urllib.parse import quote

    if max_class and remove:
        raise click.UsageError("give --max or --remove, not both")
    with api_client(server, token, ca_bundle) as api:
        if max_class or remove:
            body = {"max_class": "" if remove else max_class, "fleet": fleet or ""}
            grants = api.post(f"/teams/{quote(team, safe='')}/priority", json=body)["priority"]
        else:
            grants = api.get(f"/teams/{quote(team, safe='')}")["priority"]
    if as_json:
        print_json(grants)
        return
    rows = [{"fleet": g["fleet"] or "every fleet", "up to": g["max_class"]} for g in grants]
    print_table(rows, ["fleet", "up to"], empty=f"{team}: no grant, up to normal on every fleet")


COMMANDS = [token_group, teams_group]
