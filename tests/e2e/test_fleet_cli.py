"""`tuneplane fleet …` against a real server process: the admin's whole round."""

from __future__ import annotations

import json

import httpx
import pytest
from click.testing import CliRunner

from tests.e2e.node_processes import Proc
from tests.helpers import wait_for
from tests.node_helpers import enroll, events
from tuneplane.app.cli import main
from tuneplane.app.db import Database
from tuneplane.app.security import hash_password, new_token

pytestmark = pytest.mark.e2e


def test_admin_manages_fleets_and_nodes_from_the_cli(db_url: str, db: Database, port: int, tmp_path) -> None:
    admin = db.call("create_user", "root", hash_password("pw"), "admin")[0]
    token, digest = new_token("tpu")
    db.call("issue_api_token", admin["id"], "cli", digest, None)
    server = Proc(["server", "--database-url", db_url, "--port", str(port), "--threads", "2"])
    url = f"http://127.0.0.1:{port}"

    def up() -> bool:
        try:
            return httpx.get(f"{url}/healthz", timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    env = {"TUNEPLANE_SERVER": url, "TUNEPLANE_TOKEN": token, "TUNEPLANE_CONFIG": str(tmp_path / "c.toml")}
    runner = CliRunner()

    def cli(*args: str) -> str:
        result = runner.invoke(main, list(args), env=env, catch_exceptions=False)
        assert result.exit_code == 0, result.output
        return result.stdout

    try:
        wait_for(up, timeout=30, what="server")
        assert "created fleet train (backend node" in cli(
            "fleet", "create", "train", "--backend", "node", "--capability", "nvlink=true"
        )
        listed = json.loads(cli("fleet", "list", "--json"))
        assert [f["fleet"] for f in listed] == ["train"] and listed[0]["capabilities"] == {"nvlink": True}
        enroll_token = cli("fleet", "enroll-token", "train", "--ttl", "10m").strip()
        assert enroll_token.startswith("tpe_")
        enroll(db, enroll_token, "box1")
        table = cli("fleet", "show", "train")
        assert "box1" in table and "active" in table and "lost" in table
        assert "is now cordoned" in cli("fleet", "cordon", "train/box1", "--reason", "fan noise")
        assert "was already cordoned" in cli("fleet", "cordon", "box1")
        assert "is now draining" in cli("fleet", "drain", "box1")
        assert "is now active" in cli("fleet", "uncordon", "box1", "--reason", "fixed")
        assert "is now retired" in cli("fleet", "retire", "box1", "--reason", "end of life")
        shown = json.loads(cli("fleet", "show", "train", "--json"))
        assert shown["fleet"]["node_list"][0]["scheduling_state"] == "retired"

        refused = runner.invoke(main, ["fleet", "uncordon", "box1"], env=env)
        assert refused.exit_code == 1 and "is retired" in refused.output
        duplicate = runner.invoke(main, ["fleet", "create", "train"], env=env)
        assert duplicate.exit_code == 1 and "Error: fleet train already exists" in duplicate.output
    finally:
        server.stop()
    log = [
        (e["kind"], e["actor"], e["reason"])
        for e in events(db)
        if e["node"] == "box1" and e["actor"] != "node:box1"
    ]
    assert ("cordon", "user:root", "fan noise") in log and ("retire", "user:root", "end of life") in log
