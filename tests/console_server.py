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
