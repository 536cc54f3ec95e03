"""Fixtures shared by the tests/db modules that drive the console over HTTP and the `tuneplane` command.

`server`: one local fleet, users each with an API token, and the console on loopback (console_server.
serving_users). A module says which users it needs with `CONSOLE_ROLES` (name → role; default alice, a
user, and root, an admin) and how many GPUs its node has with `CONSOLE_GPUS` (default 0).
`cli`: the `tuneplane` command in-process against that server (`cli(*args, user="alice")`)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.console_server import cli_invoker, serving_users
from tuneplane.app.db import Database

DEFAULT_ROLES = {"alice": "user", "root": "admin"}


@pytest.fixture
def server(
    request: pytest.FixtureRequest, db_url: str, db: Database, tmp_path: Path, port: int
) -> Iterator[dict]:
    roles = getattr(request.module, "CONSOLE_ROLES", DEFAULT_ROLES)
    gpus = getattr(request.module, "CONSOLE_GPUS", 0)
    with serving_users(db_url, db, tmp_path, port, roles, gpus=gpus) as info:
        yield info


@pytest.fixture
def cli(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, server: dict) -> Callable:
    return cli_invoker(monkeypatch, tmp_path, server["url"], server)
