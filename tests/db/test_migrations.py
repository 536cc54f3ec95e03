from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest

from app.migrate import MigrationError, discover, migrate, status

REPO = Path(__file__).resolve().parents[2]


def test_template_database_is_fully_migrated(db_url: str) -> None:
    states = {s.state for s in status(db_url)}
    assert states == {"applied"}
    with psycopg.connect(db_url) as conn:
        assert conn.execute(
            "SELECT version FROM tuneplane.schema_components WHERE name='pgqueuer'"
        ).fetchone()


def test_two_concurrent_migrates_apply_each_migration_once(empty_db_url: str) -> None:
    cmd = [sys.executable, "-m", "app", "db", "migrate", "--database-url", empty_db_url]
    procs = [
        subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for _ in range(2)
    ]
    outputs = [p.communicate(timeout=120)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outputs
    with psycopg.connect(empty_db_url) as conn:
        rows = conn.execute(
            "SELECT version, count(*) FROM tuneplane.schema_migrations GROUP BY version"
        ).fetchall()
        components = conn.execute("SELECT count(*) FROM tuneplane.schema_components").fetchone()[0]
    assert sorted(v for v, _ in rows) == [m.version for m in discover()]
    assert all(count == 1 for _, count in rows)
    assert components == 1
    # exactly one of the two runs did the work; the other waited on the lock and found nothing pending
    applied_lines = [sum("applying " in line for line in out.splitlines()) for out in outputs]
    assert sorted(applied_lines) == [0, len(discover())]


def test_changed_applied_migration_is_refused_by_name(empty_db_url: str, tmp_path: Path) -> None:
    migrations = tmp_path / "migrations"
    shutil.copytree(REPO / "sql" / "migrations", migrations)
    migrate(empty_db_url, migrations, progress=lambda _m: None)
    target = migrations / "0002_users.sql"
    target.write_text(target.read_text() + "\n-- an edit after landing\n")
    with pytest.raises(MigrationError, match=r"0002_users\.sql was changed after it was applied"):
        migrate(empty_db_url, migrations, progress=lambda _m: None)
    assert {s.state for s in status(empty_db_url, migrations) if s.version == 2} == {"changed"}


def test_pending_migration_is_listed_then_applied(empty_db_url: str, tmp_path: Path) -> None:
    migrations = tmp_path / "migrations"
    shutil.copytree(REPO / "sql" / "migrations", migrations)
    migrate(empty_db_url, migrations, progress=lambda _m: None)
    (migrations / "9999_extra.sql").write_text("CREATE TABLE tuneplane.extra (id int);")
    assert [s.state for s in status(empty_db_url, migrations) if s.version == 9999] == ["pending"]
    assert migrate(empty_db_url, migrations, progress=lambda _m: None) == ["9999_extra.sql"]


def test_badly_named_migration_file_is_refused(tmp_path: Path) -> None:
    (tmp_path / "1_bad.sql").write_text("SELECT 1;")
    with pytest.raises(MigrationError, match=r"1_bad\.sql"):
        discover(tmp_path)


def test_failed_migration_rolls_back_and_records_nothing(empty_db_url: str, tmp_path: Path) -> None:
    migrations = tmp_path / "migrations"
    shutil.copytree(REPO / "sql" / "migrations", migrations)
    (migrations / "9998_broken.sql").write_text("CREATE TABLE tuneplane.half (id int); SELECT no_such_fn();")
    with pytest.raises(psycopg.Error):
        migrate(empty_db_url, migrations, progress=lambda _m: None)
    with psycopg.connect(empty_db_url) as conn:
        assert conn.execute("SELECT to_regclass('tuneplane.half')").fetchone()[0] is None
        assert (
            conn.execute("SELECT count(*) FROM tuneplane.schema_migrations WHERE version=9998").fetchone()[0]
            == 0
        )
