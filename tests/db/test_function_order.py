"""sql/functions/order.txt is a dependency order: each file applies to a schema that holds only what the
numbered migrations leave (tables, sequences, indexes, types) plus the files listed before it.

A migrated database is stripped of every view, trigger and function of the `tuneplane` schema, then the
files are applied one by one in order.txt's order with `check_function_bodies` on, so a SQL-language
function, a view or a trigger that uses a function, view or type of a file listed later fails here, naming
both files, instead of on some later day when a `CREATE OR REPLACE` happens to run against an empty schema.
"""

from __future__ import annotations

import psycopg
import pytest

from tuneplane.app.migrate import discover_functions

# Objects the migrations' tables themselves depend on (a column default, a check constraint); they cannot be
# dropped without changing a table, so they stay. None today: a new one must be named here, with the reason.
KEPT_FOR_TABLES: set[str] = set()


def _strip_to_tables(conn: psycopg.Connection) -> None:
    """Drop every view, trigger and function of schema tuneplane; tables and their data stay."""
    needed_by_tables = conn.execute(
        """
        SELECT DISTINCT p.proname
          FROM pg_depend d
          JOIN pg_proc p ON p.oid = d.refobjid AND d.refclassid = 'pg_proc'::regclass
          JOIN pg_namespace n ON n.oid = p.pronamespace AND n.nspname = 'tuneplane'
         WHERE d.classid IN ('pg_attrdef'::regclass, 'pg_constraint'::regclass)
        """
    ).fetchall()
    assert {r[0] for r in needed_by_tables} == KEPT_FOR_TABLES, (
        "a table default or constraint now calls a stored function; "
        "name it in KEPT_FOR_TABLES with the reason"
    )
    for (view,) in conn.execute(
        "SELECT c.oid::regclass::text FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
        " WHERE n.nspname = 'tuneplane' AND c.relkind IN ('v', 'm')"
    ).fetchall():
        conn.execute(f"DROP VIEW IF EXISTS {view} CASCADE")
    for table, trigger in conn.execute(
        "SELECT t.tgrelid::regclass::text, t.tgname FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid"
        " JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = 'tuneplane' AND NOT t.tgisinternal"
    ).fetchall():
        conn.execute(f'DROP TRIGGER "{trigger}" ON {table}')
    for (routine,) in conn.execute(
        "SELECT p.oid::regprocedure::text FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace"
        " WHERE n.nspname = 'tuneplane' AND p.proname <> ALL(%s)",
        (sorted(KEPT_FOR_TABLES),),
    ).fetchall():
        conn.execute(f"DROP ROUTINE IF EXISTS {routine}")
    left = conn.execute(
        "SELECT count(*) FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace"
        " WHERE n.nspname = 'tuneplane' AND p.proname <> ALL(%s)",
        (sorted(KEPT_FOR_TABLES),),
    ).fetchone()[0]
    assert left == 0


def _routines(conn: psycopg.Connection) -> set[str]:
    rows = conn.execute(
        "SELECT p.oid::regprocedure::text FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace"
        " WHERE n.nspname = 'tuneplane'"
    ).fetchall()
    return {r[0] for r in rows}


def test_function_files_apply_in_order_to_a_schema_of_tables_only(db_url: str) -> None:
    files = discover_functions()
    with psycopg.connect(db_url) as conn:
        migrated = _routines(conn)
        _strip_to_tables(conn)
        conn.execute("SET check_function_bodies = on")
        applied: list[str] = []
        for f in files:
            try:
                with conn.transaction():
                    conn.execute(f.path.read_text())
            except psycopg.Error as exc:
                pytest.fail(
                    f"sql/functions/{f.name} does not apply after {applied or 'nothing'}: "
                    f"{type(exc).__name__}: {exc}\n"
                    "A file must come, in sql/functions/order.txt, after every file whose functions, views "
                    "or types it uses when it is created (a LANGUAGE sql body, a view, a trigger, a type)."
                )
            applied.append(f.name)
        rebuilt = _routines(conn)
        conn.rollback()
    # Every routine of a migrated database is defined by a function file: none lives only in a migration.
    assert sorted(migrated - rebuilt) == []
