"""`tuneplane usage`: GPU-, CPU-hours and cost from the usage ledger, through the server's /usage endpoint
(the Usage page's table; with --csv, exactly its CSV export)."""

from __future__ import annotations

import click

from tuneplane.app.cli.options import api_client, client_options, json_option, print_json, print_table


@click.command("usage")
@click.option("--team", default=None, help="Only this team (default: every team you can see).")
@click.option("--since", default="30d", show_default=True, help="30d, 24h, 2w or an ISO date/time (UTC).")
@click.option("--until", default=None, help="An ISO date/time (default: now).")
@click.option("--by", type=click.Choice(["team", "user", "job", "day"]), default="team", show_default=True)
@click.option("--csv", "as_csv", is_flag=True, help="Print the CSV the Usage page exports.")
@json_option
@client_options
def usage(team, since, until, by, as_csv, as_json, server, token, ca_bundle) -> None:
    """Who used which GPUs: one line per team (or user, job, day) over a window."""
    from tuneplane.app.client.transport import ClientError

    params = {k: v for k, v in {"team": team, "since": since, "until": until, "by": by}.items() if v}
    with api_client(server, token, ca_bundle) as api:
        if as_csv:
            response = api.http.get("/usage.csv", params=params)
            if not response.is_success:
                api._decode(response)  # raises the server's refusal as one line
                raise ClientError(f"server answered HTTP {response.status_code}", response.status_code)
            click.echo(response.text, nl=False)
            return
        shown = api.get("/usage", params=params, headers={"Accept": "application/json"})
    if as_json:
        print_json(shown)
        return
    columns = shown["table"]["columns"]
    rows = [dict(zip(columns, row, strict=True)) for row in shown["table"]["rows"]]
    print_table(rows, columns, empty="(no usage in this window)")


COMMANDS = [usage]
