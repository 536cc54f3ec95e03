"""Priority classes are granted (issue 38; docs/teams.md "Priority classes"): `tuneplane teams priority`
and the console's form, both `POST /teams/<name>/priority`, over a real HTTP server on loopback."""

from __future__ import annotations

import json

import httpx

from tuneplane.app.db import Database


def test_an_urgent_preview_is_refused_until_the_cli_grants_it(cli, server: dict, db: Database) -> None:
    refused = cli("preview", "--recipe", "demo", "--priority", "urgent", "--json")
    assert refused.exit_code == 1
    assert (
        "up to normal" in refused.output and "tuneplane teams priority alice --max urgent" in refused.output
    )
    assert db.fetch_one("SELECT count(*) AS n FROM previews")["n"] == 0
    assert cli("teams", "priority", "alice", "--max", "urgent").exit_code == 1  # alice is not an admin
    granted = cli("teams", "priority", "alice", "--max", "urgent", "--fleet", "local", user="root")
    assert granted.exit_code == 0, granted.output
    assert "local" in granted.output and "urgent" in granted.output
    passed = cli("preview", "--recipe", "demo", "--priority", "urgent", "--json")
    assert passed.exit_code == 0, passed.output
    assert json.loads(passed.stdout)["resolved"]["priority_class"] == "urgent"
    listed = cli("teams", "priority", "alice", "--json")
    assert json.loads(listed.stdout) == [
        {
            "team": "alice",
            "fleet": "local",
            "max_class": "urgent",
            "granted_at": json.loads(listed.stdout)[0]["granted_at"],
        }
    ]
    assert cli("teams", "priority", "alice", "--remove", "--fleet", "local", user="root").exit_code == 0
    assert cli("preview", "--recipe", "demo", "--priority", "urgent").exit_code == 1


def test_the_console_form_grants_and_the_team_page_shows_it(server: dict) -> None:
    headers = {"Authorization": f"Bearer {server['root']}"}
    page = httpx.get(f"{server['url']}/teams/alice", headers=headers)
    assert 'id="priority-form"' in page.text and "No grant: up to normal" in page.text
    form = httpx.post(f"{server['url']}/teams/alice/priority", data={"max_class": "high", "fleet": ""},
                      headers=headers)  # fmt: skip
    assert form.status_code in (200, 303), form.text
    shown = httpx.get(
        f"{server['url']}/teams/alice", headers={**headers, "Accept": "application/json"}
    ).json()
    assert [(g["fleet"], g["max_class"]) for g in shown["priority"]] == [(None, "high")]
    bad = httpx.post(f"{server['url']}/teams/alice/priority", json={"max_class": "high", "fleet": "", "x": 1},
                     headers=headers)  # fmt: skip
    assert bad.status_code == 400 and bad.json()["fields"] == {"x": "unknown field"}
