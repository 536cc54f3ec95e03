"""`tuneplane fleet …`: fleets, enrollment tokens and node scheduling, through the server's HTTP API.

These are client commands (--server/--token, env, config file) so that an admin uses the same endpoints
and the same authorization as the console's Fleet page; an operator at psql calls the same stored
functions directly (docs/runbook.md).
"""

from __future__ import annotations

from collections.abc import Callable
from urllib.parse import quote

import click

from tuneplane.app import humanize
from tuneplane.app.cli.options import api_client, client_options, json_option, print_json, print_table


def _size(value: int | None) -> str:
    return humanize.size(value or 0)


@click.group("fleet")
def fleet_group() -> None:
    """Fleets of machines, node enrollment and node scheduling state."""


@fleet_group.command("create")
@click.argument("name")
@click.option(
    "--backend", default="node", show_default=True, help="Backend plugin that runs this fleet's jobs."
)
@click.option(
    "--capability",
    "capabilities",
    multiple=True,
    metavar="KEY=VALUE",
    help="Declared capability (repeatable), e.g. shared_mounts=true.",
)
@click.option(
    "--storage",
    default=None,
    metavar="filesystem|s3://BUCKET/PREFIX",
    help="Where artifact bytes live (default: the server's own store). Credentials stay with the server "
    "(TUNEPLANE_S3_ACCESS_KEY_ID / TUNEPLANE_S3_SECRET_ACCESS_KEY).",
)
@click.option("--s3-endpoint", default=None, metavar="URL", help="S3 API endpoint (omit for AWS S3).")
@click.option("--s3-region", default="us-east-1", show_default=True)
@click.option(
    "--s3-addressing-style", type=click.Choice(["path", "virtual", "auto"]), default="path", show_default=True
)
@json_option
@client_options
def fleet_create(
    name: str,
    backend: str,
    capabilities: tuple[str, ...],
    storage: str | None,
    s3_endpoint: str | None,
    s3_region: str,
    s3_addressing_style: str,
    as_json: bool,
    server,
    token,
    ca_bundle,
) -> None:
    """Create a fleet (admin)."""
    ctx = click.get_current_context()
    given = [
        f"--{name.replace('_', '-')}"
        for name in ("s3_region", "s3_addressing_style")
        if ctx.get_parameter_source(name) is click.core.ParameterSource.COMMANDLINE
    ]
    if given and storage is None:
        # Else they would be dropped without a word and the fleet made on the server's own store.
        verb = "needs" if len(given) == 1 else "need"
        raise click.UsageError(f"{' and '.join(given)} {verb} --storage s3://BUCKET/PREFIX")
    declared: dict[str, object] = {}
    for item in capabilities:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise click.BadParameter(f"{item!r} is not KEY=VALUE", param_hint="--capability")
        declared[key] = {"true": True, "false": False}.get(value.lower(), value)
    with api_client(server, token, ca_bundle) as api:
        body: dict[str, object] = {"name": name, "backend": backend, "capabilities": declared}
        if storage is not None:
            body.update(storage=storage, s3_region=s3_region, s3_addressing_style=s3_addressing_style)
        if s3_endpoint is not None:
            # Sent even without --storage: the server refuses an endpoint for a filesystem fleet (400 naming
            # it) rather than this command silently creating a fleet on the server's own store.
            body["s3_endpoint"] = s3_endpoint
        row = api.post("/fleets", json=body)
    if as_json:
        print_json(row)
    else:
        click.echo(
            f"created fleet {row['name']} (backend {row['backend']}, id {row['id']}, "
            f"storage {storage_words(row.get('storage'))})"
        )


def storage_words(storage: dict | None) -> str:
    """A fleet's store in a few words: `filesystem` or `s3://bucket/prefix at endpoint`."""
    if not storage or storage.get("kind") != "s3":
        return "filesystem"
    url = f"s3://{storage['bucket']}/{storage.get('prefix') or ''}".rstrip("/")
    return f"{url} at {storage['endpoint']}" if storage.get("endpoint") else url


@fleet_group.command("list")
@json_option
@client_options
def fleet_list(as_json: bool, server, token, ca_bundle) -> None:
    """Fleets with node counts by connectivity and scheduling state."""
    with api_client(server, token, ca_bundle) as api:
        fleets = api.get("/fleets")["fleets"]
    if as_json:
        print_json(fleets)
        return
    rows = [
        {
            **f,
            "gpus": f"{f['allocated_gpus']}/{f['schedulable_gpus']}/{f['gpus']}"
            + (f" ({f['simulated_gpus']} simulated)" if f["simulated_gpus"] else ""),
        }
        for f in fleets
    ]
    print_table(
        rows,
        ["fleet", "backend", "nodes", "connected", "stale", "lost", "active", "cordoned", "draining", "gpus"],
        empty="no fleets",
    )
    if rows:
        click.echo("gpus = allocated/schedulable/reported")


@fleet_group.command("show")
@click.argument("name")
@json_option
@client_options
def fleet_show(name: str, as_json: bool, server, token, ca_bundle) -> None:
    """One fleet's nodes: scheduling state, connectivity, heartbeat age and capacity."""
    with api_client(server, token, ca_bundle) as api:
        data = api.get(f"/fleets/{quote(name, safe='')}")
    if as_json:
        print_json(data)
        return
    fleet = data["fleet"]
    store = storage_words(fleet.get("storage"))
    click.echo(
        f"fleet {fleet['fleet']} (backend {fleet['backend']}, storage {store}): "
        f"{fleet['nodes']} nodes, "
        f"{fleet['connected']} connected; GPUs {fleet['allocated_gpus']} allocated / "
        f"{fleet['schedulable_gpus']} schedulable / {fleet['gpus']} reported"
    )
    rows = []
    for node in fleet["node_list"]:
        gpus = ", ".join(
            f"{g['gpu_index']}:{g['model']}" + (" (simulated)" if g["simulated"] else "")
            for g in node["gpu_list"]
        )
        rows.append(
            {
                "node": node["node"],
                "id": node["node_id"],
                "scheduling": node["scheduling_state"],
                "connectivity": node["connectivity"],
                "heartbeat": "never"
                if node["heartbeat_age_s"] is None
                else f"{humanize.duration(node['heartbeat_age_s'])} ago",
                "cpus": node["cpus"],
                "memory": _size(node["memory_bytes"]),
                "gpus": gpus or "-",
                "runtimes": ",".join(node["container_runtimes"]) or "-",
                "agent": node["agent_version"] or "-",
            }
        )
    print_table(
        rows,
        [
            "node",
            "id",
            "scheduling",
            "connectivity",
            "heartbeat",
            "cpus",
            "memory",
            "gpus",
            "runtimes",
            "agent",
        ],
        empty="no nodes enrolled",
    )


@fleet_group.command("enroll-token")
@click.argument("fleet")
@click.option("--ttl", default="1h", show_default=True, help="Lifetime: 15m, 1h, 7d (1 minute to 30 days).")
@json_option
@client_options
def fleet_enroll_token(fleet: str, ttl: str, as_json: bool, server, token, ca_bundle) -> None:
    """Create a one-time enrollment token for FLEET (admin); printed once, stored only hashed."""
    with api_client(server, token, ca_bundle) as api:
        data = api.post(f"/fleets/{quote(fleet, safe='')}/enrollment-tokens", json={"ttl": ttl})
    if as_json:
        print_json(data)
        return
    click.echo(data["token"])
    click.echo(
        f"one-time token for fleet {data['fleet']}, expires {data['expires_at']}; on the machine run:",
        err=True,
    )
    click.echo(f"  {data['command']}", err=True)


@fleet_group.command("idle-policy")
@click.argument("fleet")
@click.option("--team", default=None, help="A team's override (default: the fleet's own policy).")
@click.option("--idle-after", default=None, help="Idle this long before a warning (e.g. 30m, 1h).")
@click.option("--utilization-below", type=float, default=None, help="A GPU under this % is idle.")
@click.option("--power-below", type=float, default=None, help="…and under this fraction of its power limit.")
@click.option("--action", type=click.Choice(["off", "warn", "reclaim"]), default=None)
@click.option("--idle-grace", default=None, help="Warned this long before a reclaim (e.g. 30m).")
@json_option
@client_options
def fleet_idle_policy(
    fleet: str, team: str | None, as_json: bool, server, token, ca_bundle, **values
) -> None:
    """Show FLEET's idle-GPU policy and its teams' overrides, or set one (installation admins); a value
    not given stays as it was (docs/idle.md)."""
    changes = {k: v for k, v in values.items() if v is not None}
    path = f"/fleets/{quote(fleet, safe='')}/idle-policy"
    with api_client(server, token, ca_bundle) as api:
        if changes or team:
            if not changes:
                raise click.UsageError("name what to set: --idle-after, --action, …")
            api.post(path, json={**changes, **({"team": team} if team else {})})
        data = api.get(path)
    if as_json:
        print_json(data)
        return
    rows = [
        {"scope": f"team {p['team']}" if p["team"] else "the fleet", **{k: p["applies"][k] for k in
         ("idle_after", "utilization_below", "power_below", "action", "idle_grace")}}
        for p in data["policies"]
    ]  # fmt: skip
    print_table(rows, ["scope", "idle_after", "utilization_below", "power_below", "action", "idle_grace"])


def _node_action(action: str, summary: str, path: str, describe: Callable[[str, dict], str]) -> click.Command:
    """`tuneplane fleet ACTION NODE [--reason]`: one admin action on a node through the HTTP API."""

    @click.command(action, help=f"{summary} (admin). NODE is an id, FLEET/NAME or a unique name.")
    @click.argument("node")
    @click.option("--reason", default=None, help="Why; recorded in the node's event.")
    @json_option
    @client_options
    def command(node: str, reason: str | None, as_json: bool, server, token, ca_bundle) -> None:
        with api_client(server, token, ca_bundle) as api:
            row = api.post(path, json={"node": node, "action": action, "reason": reason})
        if as_json:
            print_json(row)
        else:
            click.echo(describe(node, row))

    return command


def _scheduled(_node: str, row: dict) -> str:
    verb = "is now" if row["changed"] else "was already"
    return f"node {row['fleet']}/{row['node']} {verb} {row['scheduling_state']}"


def _fenced(_node: str, row: dict) -> str:
    return f"node {row['node']} fenced: {row['members_lost']} member(s) lost, their resources released"


def _unfenced(node: str, row: dict) -> str:
    return f"node {node} {'unfenced' if row['unfenced'] else 'was not fenced'}"


for _action, _summary in (
    ("cordon", "Stop placing new work on NODE; running work continues"),
    ("drain", "Let NODE's running work finish and place nothing new"),
    ("uncordon", "Make NODE schedulable again"),
    ("retire", "Retire NODE for good and revoke its credential"),
):
    fleet_group.add_command(_node_action(_action, _summary, "/nodes/scheduling", _scheduled))
fleet_group.add_command(
    _node_action(
        "fence",
        "Declare NODE dead: its members become lost and their resources are released",
        "/nodes/fence",
        _fenced,
    )
)
fleet_group.add_command(
    _node_action("unfence", "Let a fenced NODE take work again", "/nodes/fence", _unfenced)
)


@fleet_group.command("access")
@click.argument("fleet")
@click.argument("mode", type=click.Choice(["open", "listed"]), required=False)
@json_option
@client_options
def fleet_access(fleet: str, mode: str | None, as_json: bool, server, token, ca_bundle) -> None:
    """Who may use FLEET: every team (open) or only the teams granted it (listed; grant one with
    `tuneplane teams grant TEAM FLEET`). With MODE, set it (installation admins;
    POST /fleets/FLEET/access)."""
    path = f"/fleets/{quote(fleet, safe='')}/access"
    with api_client(server, token, ca_bundle) as api:
        data = api.post(path, json={"mode": mode}) if mode else api.get(path)
    if as_json:
        print_json(data)
        return
    if data["team_access"] == "open":
        click.echo(f"fleet {fleet}: open to every team")
    else:
        click.echo(f"fleet {fleet}: only the teams granted it (tuneplane teams grant TEAM {fleet})")
    rows = [{"team": g["team"], "slurm account": g["slurm_account"] or ""} for g in data["teams"]]
    print_table(rows, ["team", "slurm account"], empty="no team granted")


COMMANDS = [fleet_group]
