"""The CLI wraps the HTTP forms: login, preview, confirm, submit, jobs — against a real HTTP server."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner, Result
from werkzeug.serving import make_server

from tests.submission_setup import add_user, one_local_fleet
from tuneplane.app.cli import main
from tuneplane.app.client.config import read_config_file
from tuneplane.app.db import Database
from tuneplane.app.web import create_app


@pytest.fixture
def server_url(db_url: str, db: Database, tmp_path: Path, port: int) -> Iterator[str]:
    one_local_fleet(db)
    add_user(db, "alice", password="alice-pw")
    app = create_app(db_url, config={"TP_DATA_DIR": str(tmp_path / "data"), "SECRET_KEY": "test"})
    server = make_server("127.0.0.1", port, app, threaded=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{port}"
    server.shutdown()
    thread.join(10)


@pytest.fixture
def cli(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("TUNEPLANE_CONFIG", str(tmp_path / "config.toml"))
    for name in ("TUNEPLANE_SERVER", "TUNEPLANE_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    runner = CliRunner()

    def run(*args: str, input: str | None = None) -> Result:
        return runner.invoke(main, list(args), input=input, catch_exceptions=False)

    return run


@pytest.fixture
def logged_in(cli, server_url: str) -> str:
    result = cli("login", "--server", server_url, input="alice\nalice-pw\n")
    assert result.exit_code == 0, result.output
    return server_url


def test_login_prompts_and_writes_the_config(cli, server_url: str, tmp_path: Path) -> None:
    result = cli("login", "--server", server_url, input="alice\nalice-pw\n")
    assert result.exit_code == 0 and "logged in" in result.output
    config = read_config_file(tmp_path / "config.toml")
    assert config["server"] == server_url and config["token"].startswith("tpu_")
    assert (tmp_path / "config.toml").stat().st_mode & 0o777 == 0o600
    wrong = cli("login", "--server", server_url, "--username", "alice", "--password-stdin", input="nope\n")
    assert wrong.exit_code == 1 and "wrong username or password" in wrong.output


def test_preview_then_confirm_prints_id_digest_and_receipt(cli, logged_in: str) -> None:
    shown = cli("preview", "--recipe", "demo", "--param", "steps=20", "--memory", "512M")
    assert shown.exit_code == 0, shown.output
    assert "fleet        local" in shown.output and "digest" in shown.output
    preview = json.loads(
        cli("preview", "--recipe", "demo", "--param", "steps=20", "--memory", "512M", "--json").output
    )
    assert preview["resolved"]["resources"]["memory_per_node"] == 512 * 1024**2
    first = cli("confirm", preview["id"], "--digest", preview["digest"], "--json")
    again = cli("confirm", preview["id"], "--digest", preview["digest"], "--json")
    assert json.loads(first.output)["job_id"] == json.loads(again.output)["job_id"]
    human = cli("confirm", preview["id"], "--digest", preview["digest"])
    assert "already made" in human.output and "queued" in human.output


def test_submit_with_the_same_retry_key_prints_the_same_job(cli, logged_in: str) -> None:
    first = cli("submit", "--recipe", "demo", "--yes", "--json", "--retry-key", "k1")
    second = cli("submit", "--recipe", "demo", "--yes", "--json", "--retry-key", "k1")
    assert first.exit_code == 0 and second.exit_code == 0, first.output + second.output
    assert json.loads(first.stdout)["job_id"] == json.loads(second.stdout)["job_id"]
    other = cli("submit", "--recipe", "demo", "--param", "steps=3", "--yes", "--retry-key", "k1")
    assert other.exit_code == 1 and "already used to confirm preview" in other.output


def test_submit_asks_and_a_no_creates_nothing(cli, logged_in: str) -> None:
    result = cli("submit", "--recipe", "demo", input="n\n")
    assert result.exit_code == 1 and "nothing was created" in result.output
    assert json.loads(cli("jobs", "list", "--json").output) == []


def test_bad_fields_are_one_line_errors_naming_the_field(cli, logged_in: str) -> None:
    result = cli("preview", "--recipe", "demo", "--gpus-per-node", "-2")
    assert result.exit_code == 1 and "resources.gpus_per_node" in result.output
    assert "Traceback" not in result.output


def test_jobs_list_and_show(cli, logged_in: str) -> None:
    receipt = json.loads(cli("submit", "--recipe", "demo", "--yes", "--json").stdout)
    listed = cli("jobs", "list")
    assert str(receipt["job_id"]) in listed.output and "queued" in listed.output
    shown = cli("jobs", "show", str(receipt["job_id"]))
    assert "waiting for resources" in shown.output and "→ queued" in shown.output
    data = json.loads(cli("jobs", "show", str(receipt["job_id"]), "--json").output)
    assert data["events"][0]["to_state"] == "queued"
    assert cli("jobs", "show", "999999").exit_code == 1


def test_source_directory_is_packed_uploaded_and_pinned(cli, logged_in: str, tmp_path: Path) -> None:
    src = tmp_path / "project"
    (src / ".git").mkdir(parents=True)
    (src / ".git" / "HEAD").write_text("ref")
    (src / "train.py").write_text("print('hi')\n")
    result = cli("preview", "--source", str(src), "--entrypoint", "python train.py", "--json")
    assert result.exit_code == 0, result.output
    preview = json.loads(result.stdout)
    archive = preview["resolved"]["input"]["archive"]
    assert archive["member_count"] == 1 and preview["resolved"]["integration"]["name"] == "script"


def test_spec_file_with_flag_overrides(cli, logged_in: str, tmp_path: Path) -> None:
    spec = tmp_path / "job.yaml"
    spec.write_text(
        "recipe:\n  name: demo\n  params: {steps: 11}\nresources:\n  cpus_per_node: 2\npriority: 5\n"
    )
    preview = json.loads(cli("preview", "--spec", str(spec), "--priority", "7", "--json").stdout)
    assert preview["resolved"]["priority"] == 7 and preview["resolved"]["resources"]["cpus_per_node"] == 2
    assert preview["resolved"]["input"]["params"]["steps"] == 11
    broken = tmp_path / "bad.yaml"
    broken.write_text("recipe: {name: demo}\nwhat: ever\n")
    result = cli("preview", "--spec", str(broken))
    assert result.exit_code == 1 and "what" in result.output


def test_environment_flags_reach_the_lock_and_bad_ones_name_the_field(
    cli, logged_in: str, tmp_path: Path
) -> None:
    src = tmp_path / "project"
    src.mkdir()
    (src / "train.py").write_text("print('hi')\n")
    spec = tmp_path / "job.yaml"
    spec.write_text("environment:\n  packages: [six==1.16.0]\n")
    source = ("--source", str(src), "--entrypoint", "python train.py")
    result = cli("preview", "--spec", str(spec), *source, "--package", "tqdm", "--python", "3.11", "--json")
    assert result.exit_code == 0, result.output
    env = json.loads(result.stdout)["resolved"]["runtime"]["environment"]
    assert env["requested"] == ["six==1.16.0", "tqdm"] and env["packages"]["six"] == "1.16.0"
    assert env["base"] == "isolated" and env["python"] == "3.11"
    option = cli("preview", *source, "--package=--index-url=https://example.invalid")
    assert option.exit_code == 1 and "environment.packages" in option.output
    assert "Traceback" not in option.output
    missing = cli("preview", *source, "--requirements", "requirements.txt")
    assert missing.exit_code == 1 and "environment.requirements" in missing.output


def test_output_and_input_flags_reach_the_preview_and_bad_ones_name_the_flag(cli, logged_in: str) -> None:
    default = json.loads(cli("preview", "--recipe", "demo", "--json").output)
    assert default["resolved"]["outputs"] == [{"name": "checkpoint", "path": "checkpoint"}]  # the recipe's
    shown = cli("preview", "--recipe", "demo", "--output", "ckpt=checkpoint", "--output", "extra=more:object")
    assert shown.exit_code == 0, shown.output
    assert "output       ckpt: checkpoint (delivery the fleet default)" in shown.output
    assert "output       extra: more (delivery object)" in shown.output
    shared = cli("preview", "--recipe", "demo", "--output", "ckpt=checkpoint:shared")
    assert shared.exit_code == 1 and "asks for delivery on a shared mount" in shared.output
    malformed = cli("preview", "--recipe", "demo", "--output", "just-a-name")
    assert malformed.exit_code == 1 and "--output" in malformed.output and "NAME=PATH" in malformed.output
    missing = cli("preview", "--recipe", "demo", "--input", "base=999/ckpt")
    assert missing.exit_code == 1 and "no job 999" in missing.output
    reserved = cli("preview", "--recipe", "demo", "--output", "logs=logs")
    assert reserved.exit_code == 1 and "outputs.0.name" in reserved.output and "reserved" in reserved.output


def test_parse_input_and_output_text() -> None:
    from tuneplane.app.submission.io_flags import parse_input, parse_output

    assert parse_output("ckpt=a/b") == {"name": "ckpt", "path": "a/b"}
    assert parse_output("ckpt=a:b:shared") == {"name": "ckpt", "path": "a:b", "delivery": "shared"}
    assert parse_input("base=12/ckpt") == {"name": "base", "artifact": "12/ckpt"}
    assert parse_input("base=12/checkpoint.2@1:w") == {
        "name": "base",
        "artifact": "12/checkpoint.2@1",
        "path": "w",
    }
    digest = "a" * 64
    assert parse_input(f"b=sha256:{digest}:p") == {"name": "b", "artifact": f"sha256:{digest}", "path": "p"}
    with pytest.raises(ValueError, match="NAME=REF"):
        parse_input("=12/ckpt")


def test_token_list_shows_each_tokens_expiry(cli, logged_in: str) -> None:
    made = cli("token", "create", "--name", "short", "--ttl", "2h")
    assert made.exit_code == 0, made.output
    listed = cli("token", "list")
    header, *lines = listed.output.splitlines()
    assert "EXPIRES" in header.split()
    short = next(line for line in lines if " short " in line)
    assert "in 1 h" in short or "in 2 h" in short, short
    assert any("never" in line.split()[-2:] for line in lines if " short " not in line), listed.output


def test_a_jobs_team_is_in_list_show_their_json_and_the_team_filter(cli, logged_in: str) -> None:
    receipt = json.loads(cli("submit", "--recipe", "demo", "--yes", "--json").stdout)
    header, *lines = cli("jobs", "list").output.splitlines()
    assert header.split()[:3] == ["ID", "STATE", "TEAM"] and lines[0].split()[2] == "alice"
    assert "  team             alice" in cli("jobs", "show", str(receipt["job_id"])).output
    assert json.loads(cli("jobs", "list", "--json").output)[0]["team"] == "alice"
    assert json.loads(cli("jobs", "show", str(receipt["job_id"]), "--json").output)["team"] == "alice"
    assert [j["id"] for j in json.loads(cli("jobs", "list", "--team", "alice", "--json").output)] == [
        receipt["job_id"]
    ]
    assert json.loads(cli("jobs", "list", "--team", "nobody", "--json").output) == []
