"""`tuneplane teams …` and `tuneplane fleet access` over a real console on loopback (issue 34, item 2): every
team operation of the console, through the same HTTP forms; and every `tuneplane …` command a refusal or
message names (SQL and Python) exists."""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Iterator
from pathlib import Path

import click
import httpx
import pytest
from click.testing import CliRunner

from tuneplane.app.cli import main

ROOT = Path(__file__).resolve().parents[2]


CONSOLE_ROLES = {
    "alice": "user",
    "bob": "user",
    "root": "admin",
}  # the `server` and `cli` fixtures: tests/db/conftest.py


def _ok(result) -> str:
    assert result.exit_code == 0, result.output
    return result.output


def test_a_team_is_made_staffed_given_a_quota_and_a_listed_fleet_from_the_cli(cli, server: dict) -> None:
    assert "team vision created" in _ok(cli("teams", "create", "vision"))
    assert "vision" in _ok(cli("teams", "list"))
    _ok(cli("teams", "members", "add", "vision", "bob"))
    _ok(cli("teams", "members", "role", "vision", "bob", "viewer"))
    members = json.loads(_ok(cli("teams", "show", "vision", "--json")))["members"]
    assert {m["username"]: m["role"] for m in members} == {"alice": "admin", "bob": "viewer"}
    _ok(cli("teams", "members", "remove", "vision", "bob"))
    assert "bob" not in _ok(cli("teams", "show", "vision"))
    # A viewer (bob, back as one) may not change members; alice is no installation admin: no quota.
    _ok(cli("teams", "members", "add", "vision", "bob", "--role", "viewer"))
    refused = cli("teams", "members", "add", "vision", "root", user="bob")
    assert refused.exit_code == 1 and "only an admin of the team" in refused.output
    refused = cli("teams", "quota", "set", "vision", "local", "--guaranteed", "0")
    assert refused.exit_code == 1 and "installation admin" in refused.output
    _ok(cli("teams", "quota", "set", "vision", "local", "--guaranteed", "0", "--limit", "4", user="root"))
    quotas = json.loads(_ok(cli("teams", "show", "vision", "--json")))["quotas"]
    set_ = [(q["fleet"], q["limit_gpus"]) for q in quotas if q["guaranteed_gpus"] is not None]
    assert set_ == [("local", 4)]
    _ok(cli("teams", "quota", "remove", "vision", "local", user="root"))
    quotas = json.loads(_ok(cli("teams", "show", "vision", "--json")))["quotas"]
    assert [q for q in quotas if q["guaranteed_gpus"] is not None] == []
    # The fleet takes listed teams only: vision's preview is refused, naming the command that grants it.
    assert "open to every team" in _ok(cli("fleet", "access", "local"))
    _ok(cli("fleet", "access", "local", "listed", user="root"))
    refused = cli("preview", "--recipe", "demo", "--team", "vision")
    assert refused.exit_code == 1 and "tuneplane teams grant vision local" in refused.output
    granted = _ok(cli("teams", "grant", "vision", "local", "--slurm-account", "acct_v", user="root"))
    assert "team vision may use fleet local (Slurm account acct_v)" in granted
    _ok(cli("preview", "--recipe", "demo", "--team", "vision"))
    access = json.loads(_ok(cli("fleet", "access", "local", "--json")))
    assert access["team_access"] == "listed"
    assert [(g["team"], g["slurm_account"]) for g in access["teams"]] == [("vision", "acct_v")]
    assert "acct_v" in _ok(cli("teams", "show", "vision"))
    _ok(cli("teams", "revoke", "vision", "local", user="root"))
    assert cli("preview", "--recipe", "demo", "--team", "vision").exit_code == 1
    again = cli("teams", "revoke", "vision", "local", user="root")
    assert again.exit_code == 1 and "has no grant" in again.output
    assert cli("fleet", "access", "local", "open").exit_code == 1  # alice is no installation admin
    _ok(cli("fleet", "access", "local", "open", user="root"))


def test_a_team_admin_manages_webhooks_from_the_cli(
    cli, server: dict, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TUNEPLANE_WEBHOOK_ALLOW", "127.0.0.1")  # the console (in this process) reads it
    added = _ok(cli("teams", "webhooks", "add", "alice", "http://127.0.0.1:9/hook", "--kind", "job.failed"))
    assert "webhook 1 added" in added and "its secret (shown once):" in added
    listed = json.loads(_ok(cli("teams", "webhooks", "list", "alice", "--json")))
    assert [(h["id"], h["kinds"]) for h in listed] == [(1, ["job.failed"])]
    refused = cli("teams", "webhooks", "list", "alice", user="bob")
    assert refused.exit_code == 1 and "no team alice" in refused.output
    _ok(cli("teams", "webhooks", "remove", "alice", "1"))
    assert "no webhooks" in _ok(cli("teams", "webhooks", "list", "alice"))


def test_the_console_fleet_page_offers_the_same_forms(server: dict) -> None:
    headers = {"Authorization": f"Bearer {server['root']}"}
    page = httpx.get(f"{server['url']}/fleets/local", headers=headers)
    assert 'id="fleet-access"' in page.text and "/fleets/local/team-access" in page.text
    form = httpx.post(f"{server['url']}/fleets/local/access", data={"mode": "listed"}, headers=headers)
    assert form.status_code == 303
    bad = httpx.post(f"{server['url']}/fleets/local/access", json={"mode": "closed"}, headers=headers)
    assert bad.status_code == 400 and "mode" in bad.json()["fields"]
    bad = httpx.post(
        f"{server['url']}/fleets/local/team-access",
        json={"team": "alice", "slurm_account": "no spaces"},
        headers=headers,
    )
    assert bad.status_code == 400 and "slurm_account" in bad.json()["fields"]
    url = f"{server['url']}/fleets/local/team-access"
    missing = httpx.post(url, json={"team": "nobody"}, headers=headers)
    assert missing.status_code == 404 and "team" in missing.json()["fields"]


# `tuneplane <words>` inside a message: the words that may name a command.
COMMAND = re.compile(r"tuneplane((?: [a-z][a-z0-9-]*)+)")


def _sql_messages() -> Iterator[tuple[str, str]]:
    for path in sorted((ROOT / "sql" / "functions").glob("*.sql")):
        text = re.sub(r"--[^\n]*", "", path.read_text())  # comments are not messages
        for literal in re.findall(r"'((?:[^']|'')*)'", text):
            yield path.name, literal


def _python_messages() -> Iterator[tuple[str, str]]:
    for path in sorted((ROOT / "app").rglob("*.py")):
        tree = ast.parse(path.read_text())
        docstrings = {
            id(node.body[0].value)
            for node in ast.walk(tree)
            if isinstance(node, ast.Module | ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)
            and node.body
            and isinstance(node.body[0], ast.Expr)
            and isinstance(node.body[0].value, ast.Constant)
        }
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
                yield str(path.relative_to(ROOT)), node.value


def _resolve(words: list[str]) -> list[str] | None:
    """The command path the words name (subcommands while the command is a group; what follows a leaf is
    its arguments), or None when a group is followed by a word that is none of its subcommands."""
    ctx = click.Context(main)
    command: click.Command = main
    path: list[str] = []
    for word in words:
        if not isinstance(command, click.Group):
            break
        sub = command.get_command(ctx, word)
        if sub is None:
            return None
        command, path = sub, [*path, word]
    return path


def test_every_command_a_message_names_exists_and_answers_help() -> None:
    named: dict[str, set[str]] = {}
    for where, message in [*_sql_messages(), *_python_messages()]:
        for match in COMMAND.finditer(message):
            named.setdefault(match.group(1).strip(), set()).add(where)
    assert "teams grant" in " ".join(named), "the fleet refusal names tuneplane teams grant"
    missing, runner = [], CliRunner()
    for words, where in sorted(named.items()):
        path = _resolve(words.split())
        if not path:
            missing.append(f"tuneplane {words} ({', '.join(sorted(where))})")
            continue
        result = runner.invoke(main, [*path, "--help"])
        if result.exit_code != 0:
            missing.append(f"tuneplane {' '.join(path)} --help: {result.output[:200]}")
    assert missing == [], "messages that name a command that does not exist:\n" + "\n".join(missing)


def test_a_fleets_access_shows_a_user_only_the_grants_of_teams_they_may_read(server: dict, db) -> None:
    """fleet_team_access_of (teams.sql): an installation admin sees every team's grant on a fleet; a user
    sees the fleet's mode and the grants of their own teams only, not which other teams may use it."""
    db.call("create_team", server["alice_id"], "vision")
    db.call("create_team", server["root_id"], "secret")
    root = {"Authorization": f"Bearer {server['root']}", "Accept": "application/json"}
    for team in ("vision", "secret"):
        granted = httpx.post(f"{server['url']}/fleets/local/team-access", json={"team": team}, headers=root)
        assert granted.status_code == 200, granted.text
    url = f"{server['url']}/fleets/local/access"
    assert [g["team"] for g in httpx.get(url, headers=root).json()["teams"]] == ["secret", "vision"]
    alice = httpx.get(url, headers={"Authorization": f"Bearer {server['alice']}"}).json()
    assert alice["team_access"] == "open" and [g["team"] for g in alice["teams"]] == ["vision"]
