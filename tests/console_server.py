"""The console (Flask app) served on a loopback port in a thread, and click's runner for client commands
against it with a user's API token: the shared setup of the CLI tests."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from click.testing import CliRunner, Result
from werkzeug.serving import make_server

from tuneplane.app.cli import main
from tuneplane.app.db import Database
from tuneplane.app.security import new_token
from tuneplane.app.web import create_app


@contextmanager
def serving_users(
    db_url: str, db: Database, tmp_path: Path, port: int, roles: dict[str, str], gpus: int = 0
) -> Iterator[dict]:
    """One local fleet (`gpus` per node), the users of `roles` (name → role) each with an API token, and the
    console serving them: {"fleet", "url", "<name>_id", "<name>": token}."""
    from tests.submission_setup import add_user, one_local_fleet

    info: dict = {"fleet": one_local_fleet(db, gpus=gpus)}
    for name, role in roles.items():
        info[f"{name}_id"] = add_user(db, name, role)
        info[name] = api_token(db, info[f"{name}_id"])
    with serving_console(db_url, tmp_path, port) as url:
        info["url"] = url
        yield info


def api_token(db: Database, user_id: int) -> str:
    plaintext, digest = new_token("tpu")
    db.call("issue_api_token", user_id, "test", digest, None)
    return plaintext


@contextmanager
def serving_console(db_url: str, tmp_path: Path, port: int) -> Iterator[str]:
    """The console on 127.0.0.1:port; yields its URL."""
    app = create_app(db_url, config={"TP_DATA_DIR": str(tmp_path / "data"), "SECRET_KEY": "test"})
    httpd = make_server("127.0.0.1", port, app, threaded=True)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        httpd.shutdown()
        thread.join(10)


def cli_invoker(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, url: str, tokens: dict[str, str]
) -> Callable[..., Result]:
    """run(*args, user="alice"): the `tuneplane` command in-process against `url` with that user's token."""
    monkeypatch.setenv("TUNEPLANE_CONFIG", str(tmp_path / "config.toml"))
    monkeypatch.setenv("TUNEPLANE_SERVER", url)
    monkeypatch.delenv("TUNEPLANE_TOKEN", raising=False)
    runner = CliRunner()

    def run(*args: str, user: str = "alice") -> Result:
        return runner.invoke(main, [*args, "--token", tokens[user]], catch_exceptions=False)

    return run
