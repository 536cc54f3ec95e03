from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from tuneplane.app.cli import main
from tuneplane.app.client.http import ClientError, check_transport
from tuneplane.app.plugins import Plugin, load_plugins
from tuneplane.app.settings import SettingsError, load_settings


def test_database_url_must_be_postgres() -> None:
    with pytest.raises(SettingsError, match="TUNEPLANE_DATABASE_URL"):
        load_settings(database_url="mysql://x")


def test_data_dir_that_is_a_file_is_refused(tmp_path) -> None:
    f = tmp_path / "file"
    f.write_text("x")
    with pytest.raises(SettingsError, match="not a directory"):
        load_settings(data_dir=f)


def test_builtin_plugins_are_registered_by_purpose() -> None:
    groups = load_plugins()
    assert set(groups) == {"backends", "integrations", "telemetry_sources", "storage"}
    names = {item.plugin.name for item in groups["backends"] if item.plugin}
    assert "node" in names
    for items in groups.values():
        for item in items:
            assert item.error is None, item.error
            assert item.plugin.executes_on


def test_plugins_command_json_lists_capabilities() -> None:
    result = CliRunner().invoke(main, ["plugins", "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    node = next(p for p in data["backends"] if p["name"] == "node")
    assert "prepare_commit" in node["capabilities"] and "worker" in node["executes_on"]


def test_plugin_with_unknown_execution_place_is_rejected() -> None:
    with pytest.raises(ValueError, match="unknown execution places"):
        Plugin(name="x", purpose="storage", description="", executes_on=("moon",))


def test_plain_http_only_to_loopback() -> None:
    check_transport("http://127.0.0.1:8080")
    check_transport("http://localhost:8080")
    check_transport("https://tp.example.com")
    with pytest.raises(ClientError, match="plain HTTP"):
        check_transport("http://tp.example.com")


def test_server_command_without_database_is_a_one_line_error(monkeypatch) -> None:
    monkeypatch.delenv("TUNEPLANE_DATABASE_URL", raising=False)
    result = CliRunner().invoke(main, ["server"])
    assert result.exit_code != 0
    assert "needs --database-url" in result.output
