"""`tuneplane token …` and `tuneplane teams …`: scoped API tokens and teams, through the server's HTTP API.

Client commands (--server/--token, env, config file): the same endpoints and the same checks as the
console; the rules (roles, token scopes, quota sums) are the stored functions' (docs/teams.md).
"""

from __future__ import annotations

from urllib.parse import quote

import click

from tuneplane.app import humanize
from tuneplane.app.cli.options import api_client, client_options, json_option, print_json, print_table


@click.group("token")
def token_group() -> None:
    """Your API tokens: make one narrowed to teams and/or read-only, list them, revoke one."""


@token_group.command("create")
@click.option("--name", default="api", show_default=True, help="A name to tell the token apart.")
@click.option("--team", "teams", multiple=True, help="Only this team (repeatable; default: all your teams).")
@click.option("--read-only", is_flag=True, help="The token may only read: every change is refused.")
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
    """Teams: make and list them, their members and roles, quotas, the listed fleets they may use and
    their priority classes. Each command is a form of the console's team and fleet pages (same endpoint,
    same checks)."""


def _team_path(team: str, *rest: str) -> str:
    return "/".join(["/teams", quote(team, safe=""), *rest])


@teams_group.command("create")
@click.argument("name")
@json_option
@client_options
def teams_create(name: str, as_json: bool, server, token, ca_bundle) -> None:
    """Make a shared team NAME; you become its admin (POST /teams)."""
    with api_client(server, token, ca_bundle) as api:
        team = api.post("/teams", json={"name": name})
    if as_json:
        print_json(team)
        return
    click.echo(f"team {team['name']} created; you are its admin (add members: tuneplane teams members add)")


@teams_group.command("list")
@json_option
@client_options
def teams_list(as_json: bool, server, token, ca_bundle) -> None:
    """The teams you have a role in (GET /teams)."""
    with api_client(server, token, ca_bundle) as api:
        teams = api.get("/teams")["teams"]
    if as_json:
        print_json(teams)
        return
    rows = [
        {
            "team": t["team"],
            "role": t["role"],
            "kind": "personal" if t["personal"] else "shared",
            "default": "yes" if t["is_default"] else "",
        }
        for t in teams
    ]
    print_table(rows, ["team", "role", "kind", "default"], empty="no teams")


@teams_group.command("show")
@click.argument("team")
@json_option
@client_options
def teams_show(team: str, as_json: bool, server, token, ca_bundle) -> None:
    """TEAM's members and roles, quotas per fleet, listed fleets it may use and queue (GET /teams/TEAM)."""
    with api_client(server, token, ca_bundle) as api:
        page = api.get(_team_path(team))
    if as_json:
        print_json(page)
        return
    click.echo(f"team {page['team']}" + (f" (you: {page['my_role']})" if page.get("my_role") else ""))
    click.echo("\nmembers")
    print_table(page["members"], ["username", "role"], empty="  none")
    click.echo("\nquotas")
    quotas = [
        {
            "fleet": q["fleet"],
            "model": q["gpu_model"] or "any",
            "guaranteed": q["guaranteed_gpus"],
            "limit": "none" if q["limit_gpus"] is None else q["limit_gpus"],
            "weight": q["weight"],
            "in use": q["used_gpus"],
        }
        for q in page["quotas"]
        if q.get("guaranteed_gpus") is not None
    ]
    print_table(quotas, ["fleet", "model", "guaranteed", "limit", "weight", "in use"], empty="  none")
    click.echo("\nlisted fleets granted")
    grants = [{"fleet": g["fleet"], "slurm account": g["slurm_account"] or ""} for g in page["fleet_access"]]
    print_table(grants, ["fleet", "slurm account"], empty="  none (open fleets take every team)")
    click.echo(f"\nqueue: {len(page['queue'])} job(s) waiting")


@teams_group.group("members")
def teams_members() -> None:
    """Add, remove or change the role of a team's members (team admins; POST /teams/TEAM/members)."""


def _set_member(team: str, username: str, role: str, server, token, ca_bundle) -> dict:
    with api_client(server, token, ca_bundle) as api:
        return api.post(_team_path(team, "members"), json={"username": username, "role": role})


ROLES = click.Choice(["admin", "member", "viewer"])


@teams_members.command("add")
@click.argument("team")
@click.argument("username")
@click.option("--role", type=ROLES, default="member", show_default=True)
@client_options
def members_add(team: str, username: str, role: str, server, token, ca_bundle) -> None:
    """Add USERNAME to TEAM with a role."""
    _set_member(team, username, role, server, token, ca_bundle)
    click.echo(f"{username} is now {role} of {team}")


@teams_members.command("remove")
@click.argument("team")
@click.argument("username")
@client_options
def members_remove(team: str, username: str, server, token, ca_bundle) -> None:
    """Remove USERNAME from TEAM (a team keeps at least one admin)."""
    _set_member(team, username, "remove", server, token, ca_bundle)
    click.echo(f"{username} removed from {team}")


@teams_members.command("role")
@click.argument("team")
@click.argument("username")
@click.argument("role", type=ROLES)
@client_options
def members_role(team: str, username: str, role: str, server, token, ca_bundle) -> None:
    """Change USERNAME's role in TEAM to ROLE."""
    _set_member(team, username, role, server, token, ca_bundle)
    click.echo(f"{username} is now {role} of {team}")


@teams_group.group("quota")
def teams_quota() -> None:
    """A team's quota on a fleet (installation admins; POST /teams/TEAM/quotas)."""


@teams_quota.command("set")
@click.argument("team")
@click.argument("fleet")
@click.option("--guaranteed", type=click.IntRange(0), required=True, help="GPUs always available to TEAM.")
@click.option(
    "--limit", type=click.IntRange(0), default=None, help="Most GPUs TEAM may hold (default: none)."
)
@click.option("--weight", type=float, default=1.0, show_default=True, help="Fair-share weight.")
@click.option("--gpu-model", default="", help="Only GPUs of this model (default: every model).")
@click.option("--overcommit", is_flag=True, help="Accept guarantees that sum past the fleet's GPUs.")
@json_option
@client_options
def quota_set(
    team: str, fleet: str, guaranteed: int, limit: int | None, weight: float, gpu_model: str,
    overcommit: bool, as_json: bool, server, token, ca_bundle,
) -> None:  # fmt: skip
    """Set TEAM's quota on FLEET."""
    body = {"fleet": fleet, "gpu_model": gpu_model, "guaranteed_gpus": guaranteed, "limit_gpus": limit,
            "weight": weight, "overcommit": overcommit}  # fmt: skip
    with api_client(server, token, ca_bundle) as api:
        data = api.post(_team_path(team, "quotas"), json=body)
    if as_json:
        print_json(data)
        return
    click.echo(
        f"quota of {team} on {fleet}: {guaranteed} guaranteed, limit {'none' if limit is None else limit}"
    )


@teams_quota.command("remove")
@click.argument("team")
@click.argument("fleet")
@click.option("--gpu-model", default="", help="The per-model quota to remove (default: the fleet-wide one).")
@client_options
def quota_remove(team: str, fleet: str, gpu_model: str, server, token, ca_bundle) -> None:
    """Remove TEAM's quota on FLEET."""
    with api_client(server, token, ca_bundle) as api:
        api.post(
            _team_path(team, "quotas"), json={"fleet": fleet, "gpu_model": gpu_model, "guaranteed_gpus": None}
        )
    click.echo(f"quota of {team} on {fleet} removed")


def _team_access(fleet: str, body: dict, server, token, ca_bundle) -> dict:
    with api_client(server, token, ca_bundle) as api:
        return api.post(f"/fleets/{quote(fleet, safe='')}/team-access", json=body)


@teams_group.command("grant")
@click.argument("team")
@click.argument("fleet")
@click.option(
    "--slurm-account", default=None, help="Slurm fleets: the account TEAM's jobs are submitted under."
)
@json_option
@client_options
def teams_grant(
    team: str, fleet: str, slurm_account: str | None, as_json: bool, server, token, ca_bundle
) -> None:
    """Let TEAM use FLEET when the fleet takes listed teams only (installation admins; see
    `tuneplane fleet access`). Granting again changes the Slurm account."""
    body = {"team": team, "action": "grant", "slurm_account": slurm_account}
    data = _team_access(fleet, body, server, token, ca_bundle)
    if as_json:
        print_json(data)
        return
    account = f" (Slurm account {slurm_account})" if slurm_account else ""
    note = "" if data["team_access"] == "listed" else f"; {fleet} is open to every team for now"
    click.echo(f"team {team} may use fleet {fleet}{account}{note}")


@teams_group.command("revoke")
@click.argument("team")
@click.argument("fleet")
@json_option
@client_options
def teams_revoke(team: str, fleet: str, as_json: bool, server, token, ca_bundle) -> None:
    """Take back TEAM's grant on FLEET (installation admins)."""
    data = _team_access(fleet, {"team": team, "action": "revoke"}, server, token, ca_bundle)
    if as_json:
        print_json(data)
        return
    click.echo(f"team {team}'s grant on fleet {fleet} revoked")


@teams_group.group("webhooks")
def teams_webhooks() -> None:
    """A team's webhooks: list, add, remove (team admins; the team page's forms)."""


@teams_webhooks.command("list")
@click.argument("team")
@json_option
@client_options
def webhooks_list(team: str, as_json: bool, server, token, ca_bundle) -> None:
    """TEAM's webhooks with their deliveries so far (never their secrets)."""
    with api_client(server, token, ca_bundle) as api:
        hooks = api.get(_team_path(team))["webhooks"]
    if hooks is None:
        raise click.ClickException(f"only an admin of team {team} sees its webhooks")
    if as_json:
        print_json(hooks)
        return
    rows = [
        {
            "id": h["id"],
            "url": h["url"],
            "kinds": " ".join(h["kinds"] or []) or "every kind",
            "delivered": h["delivered"],
            "pending": h["pending"],
            "gave up": h["gave_up"],
        }
        for h in hooks
    ]
    print_table(rows, ["id", "url", "kinds", "delivered", "pending", "gave up"], empty="no webhooks")


@teams_webhooks.command("add")
@click.argument("team")
@click.argument("url")
@click.option("--secret", default="", help="The signing secret (default: generated and shown once).")
@click.option(
    "--kind", "kinds", multiple=True, help="An event kind, e.g. job.failed (repeatable; default every kind)."
)
@json_option
@client_options
def webhooks_add(
    team: str, url: str, secret: str, kinds: tuple[str, ...], as_json: bool, server, token, ca_bundle
) -> None:
    """Send TEAM's job events to URL, signed with a secret (POST /teams/TEAM/webhooks)."""
    with api_client(server, token, ca_bundle) as api:
        body = {"url": url, "secret": secret, **({"kinds": list(kinds)} if kinds else {})}
        hook = api.post(_team_path(team, "webhooks"), json=body)
    if as_json:
        print_json(hook)
        return
    click.echo(f"webhook {hook['id']} added for {hook['url']}")
    if "secret" in hook:
        click.echo(f"its secret (shown once): {hook['secret']}")


@teams_webhooks.command("remove")
@click.argument("team")
@click.argument("webhook_id", type=click.IntRange(1))
@client_options
def webhooks_remove(team: str, webhook_id: int, server, token, ca_bundle) -> None:
    """Remove webhook WEBHOOK_ID of TEAM."""
    with api_client(server, token, ca_bundle) as api:
        api.post(_team_path(team, "webhooks", str(webhook_id), "remove"), json={})
    click.echo(f"webhook {webhook_id} removed")


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
