"""Idle-GPU policies over HTTP, the console form and `tuneplane fleet idle-policy` (issue 38; docs/idle.md):
installation admins set a fleet's policy or a team's override, anyone logged in reads them; unknown teams
and fleets are 404s, not a raw foreign-key error; a real HTTP server on loopback."""

from __future__ import annotations

import json

import httpx
import pytest

from tests.submission_setup import add_user, one_local_fleet
from tuneplane.app.db import Database
from tuneplane.app.errors import Refusal


def test_set_idle_policy_with_an_unknown_team_is_a_404_not_a_foreign_key_error(db: Database) -> None:
    one_local_fleet(db)
    admin = add_user(db, "root", "admin")
    with pytest.raises(Refusal) as refused:
        db.call("set_idle_policy", admin, "local", 999_999, None, None, None, "warn", None)
    assert refused.value.status == 404 and "team" in refused.value.fields


def test_the_cli_sets_and_shows_a_fleets_policy_and_a_teams_override(cli, server: dict, db: Database) -> None:
    done = cli("fleet", "idle-policy", "local", "--action", "reclaim", "--idle-after", "45m", user="root")
    assert done.exit_code == 0, done.output
    done = cli("fleet", "idle-policy", "local", "--team", "alice", "--action", "warn", user="root")
    assert done.exit_code == 0, done.output
    shown = json.loads(cli("fleet", "idle-policy", "local", "--json").stdout)
    scopes = {p["team"]: p for p in shown["policies"]}
    assert scopes[None]["action"] == "reclaim" and scopes["alice"]["applies"]["action"] == "warn"
    assert scopes["alice"]["action"] == "warn" and scopes["alice"]["idle_after"] is None  # inherited
    assert "reclaim" in cli("fleet", "idle-policy", "local").output
    refused = cli("fleet", "idle-policy", "local", "--action", "off")  # alice is no admin
    assert refused.exit_code == 1 and "admin" in refused.output
    for args, said in (
        (["--team", "nobody", "--action", "warn"], "no team nobody"),
        (["--idle-after", "４５m"], "idle_after"),
        (["--idle-after", "0s"], "idle_after"),
    ):
        refused = cli("fleet", "idle-policy", "local", *args, user="root")
        assert refused.exit_code == 1 and said in refused.output, refused.output
    unknown = cli("fleet", "idle-policy", "nofleet", "--action", "warn", user="root")
    assert unknown.exit_code == 1 and "no fleet nofleet" in unknown.output


def test_the_http_form_is_strict_for_json_and_the_console_form_sets_it(server: dict) -> None:
    url, admin = server["url"], {"Authorization": f"Bearer {server['root']}"}
    bad = httpx.post(f"{url}/fleets/local/idle-policy", json={"utilization_below": "5"}, headers=admin)
    assert bad.status_code == 400 and "utilization_below" in bad.json()["fields"]
    bad = httpx.post(f"{url}/fleets/local/idle-policy", json={"acton": "warn"}, headers=admin)
    assert bad.status_code == 400 and bad.json()["fields"] == {"acton": "unknown field"}
    assert httpx.get(f"{url}/fleets/nofleet/idle-policy", headers=admin).status_code == 404
    page = httpx.get(f"{url}/fleets/local", headers=admin)
    assert 'id="idle-policy-form"' in page.text
    form = {"team": "", "idle_after": "20m", "utilization_below": "3", "power_below": "", "action": "reclaim",
            "idle_grace": ""}  # fmt: skip
    posted = httpx.post(f"{url}/fleets/local/idle-policy", data=form, headers=admin)
    assert posted.status_code == 303, posted.text
    shown = httpx.get(f"{url}/fleets/local/idle-policy", headers=admin).json()["policies"][0]
    assert (shown["action"], shown["utilization_below"]) == ("reclaim", 3.0)
