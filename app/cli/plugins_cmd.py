"""`tuneplane plugins`."""

from __future__ import annotations

import click

from tuneplane.app.cli.options import json_option, print_json, print_table
from tuneplane.app.plugins import load_plugins


@click.command("plugins")
@json_option
def plugins_cmd(as_json: bool) -> None:
    """List installed plugins by purpose, with capabilities and where they execute."""
    groups = load_plugins()
    if as_json:
        print_json({purpose: [p.as_json() for p in items] for purpose, items in groups.items()})
        return
    rows = []
    for purpose, items in groups.items():
        for item in items:
            plugin = item.plugin
            rows.append(
                {
                    "purpose": purpose,
                    "name": plugin.name if plugin else item.entry_point,
                    "capabilities": ",".join(plugin.capabilities) if plugin else "",
                    "executes_on": ",".join(plugin.executes_on) if plugin else "",
                    "status": "ok" if plugin else f"error: {item.error}",
                }
            )
    print_table(rows, ["purpose", "name", "capabilities", "executes_on", "status"])


COMMANDS = [plugins_cmd]
