from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest

from tuneplane.app.migrate import (
    MigrationError,
    discover,
    discover_functions,
    functions_status,
    migrate,
    status,
)

REPO = Path(__file__).resolve().parents[2]


def test_template_database_is_fully_migrated(db_url: str) -> None:
    states = {s.state for s in status(db_url)}
    assert states == {"applied"}
    with psycopg.connect(db_url) as conn:
        assert conn.execute(
            "SELECT version FROM tuneplane.schema_components WHERE name='pgqueuer'"
        ).fetchone()


def test_two_concurrent_migrates_apply_each_migration_once(empty_db_url: str) -> None:
    cmd = [sys.executable, "-P", "-m", "tuneplane", "db", "migrate", "--database-url", empty_db_url]
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
    applied_lines = [sum(line.startswith("applying 0") for line in out.splitlines()) for out in outputs]
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


# --- repeatable function files (ADR 0012) ---------------------------------------------------------------

_DEFINED = re.compile(
    r"^\s*CREATE\s+OR\s+REPLACE\s+(FUNCTION|VIEW|TRIGGER)\s+(?:tuneplane\.)?(\w+)",
    re.IGNORECASE | re.MULTILINE,
)


def _defined_in_files() -> dict[tuple[str, str], list[str]]:
    found: dict[tuple[str, str], list[str]] = {}
    for f in discover_functions():
        for kind, name in _DEFINED.findall(f.path.read_text()):
            found.setdefault((kind.lower(), name), []).append(f.name)
    return found


def test_every_function_view_and_trigger_is_defined_once_in_a_function_file(db_url: str) -> None:
    with psycopg.connect(db_url) as conn:
        in_db = conn.execute(
            """SELECT 'function', p.proname FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
                WHERE n.nspname = 'tuneplane'
               UNION ALL
               SELECT 'view', c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
                WHERE n.nspname = 'tuneplane' AND c.relkind = 'v'
               UNION ALL
               SELECT 'trigger', t.tgname FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid
                 JOIN pg_namespace n ON n.oid = c.relnamespace
                WHERE n.nspname = 'tuneplane' AND NOT t.tgisinternal"""
        ).fetchall()
    defined = _defined_in_files()
    db_counts: dict[tuple[str, str], int] = {}
    for kind, name in in_db:
        db_counts[(kind, name)] = db_counts.get((kind, name), 0) + 1
    # an overload left behind by a signature change without its DROP shows up as a count mismatch
    missing = {k: n for k, n in db_counts.items() if len(defined.get(k, [])) != n}
    assert not missing, f"in the database but not defined exactly that often in sql/functions/: {missing}"
    stray = sorted(k for k in defined if k not in db_counts)
    assert not stray, f"defined in sql/functions/ but absent from the database: {stray}"


def test_function_files_are_reapplied_when_one_changes(empty_db_url: str, tmp_path: Path) -> None:
    functions = tmp_path / "functions"
    shutil.copytree(REPO / "sql" / "functions", functions)
    assert "sql/functions" in migrate(empty_db_url, progress=lambda _m: None, functions_dir=functions)
    # nothing changed: nothing re-applied
    assert migrate(empty_db_url, progress=lambda _m: None, functions_dir=functions) == []
    target = functions / "common.sql"
    target.write_text(
        target.read_text()
        + "\nCREATE OR REPLACE FUNCTION tuneplane.answer() RETURNS int LANGUAGE sql AS $$ SELECT 42 $$;\n"
    )
    with pytest.raises(MigrationError, match=r"functions/common\.sql is changed"):
        require_current_with(empty_db_url, functions)
    said: list[str] = []
    assert migrate(empty_db_url, progress=said.append, functions_dir=functions) == ["sql/functions"]
    assert any("common.sql" in line for line in said), said
    with psycopg.connect(empty_db_url) as conn:
        assert conn.execute("SELECT tuneplane.answer()").fetchone()[0] == 42


def require_current_with(url: str, functions: Path) -> None:
    problems = [s for s in functions_status(url, functions) if s.state != "applied"]
    if problems:
        raise MigrationError(f"{problems[0].name} is {problems[0].state}")


def test_broken_function_file_changes_nothing_and_is_named(empty_db_url: str, tmp_path: Path) -> None:
    functions = tmp_path / "functions"
    shutil.copytree(REPO / "sql" / "functions", functions)
    migrate(empty_db_url, progress=lambda _m: None, functions_dir=functions)
    (functions / "common.sql").write_text(
        (functions / "common.sql").read_text()
        + "\nCREATE OR REPLACE FUNCTION tuneplane.answer() RETURNS int LANGUAGE sql AS $$ SELECT 42 $$;\n"
    )
    (functions / "users.sql").write_text((functions / "users.sql").read_text() + "\nSELECT no_such_fn();\n")
    with pytest.raises(MigrationError, match=r"sql/functions/users\.sql"):
        migrate(empty_db_url, progress=lambda _m: None, functions_dir=functions)
    with psycopg.connect(empty_db_url) as conn:
        # the whole re-apply is one transaction: common.sql's new function is not there either
        assert conn.execute("SELECT to_regproc('tuneplane.answer')").fetchone()[0] is None


def test_function_file_missing_from_order_is_refused_by_name(tmp_path: Path) -> None:
    functions = tmp_path / "functions"
    shutil.copytree(REPO / "sql" / "functions", functions)
    (functions / "stray.sql").write_text("SELECT 1;")
    with pytest.raises(MigrationError, match=r"stray\.sql is not listed"):
        discover_functions(functions)
