"""sql/schema.sql is what the migrations produce: a migration (or a view or trigger in sql/functions/) that
changes the schema without regenerating the file fails here, with the command that regenerates it."""

from __future__ import annotations

import difflib
import os
from pathlib import Path

import psycopg
import pytest

from tuneplane.app import schema_dump

SCHEMA_FILE = Path(__file__).resolve().parents[2] / "sql" / "schema.sql"


def test_schema_file_matches_a_freshly_migrated_database(db_url: str) -> None:
    # db_url is a clone of the session's template database, which `migrate` built from empty.
    rendered = schema_dump.render(db_url)
    if os.environ.get("TUNEPLANE_WRITE_SCHEMA") == "1":
        SCHEMA_FILE.write_text(rendered)
    stored = SCHEMA_FILE.read_text() if SCHEMA_FILE.exists() else ""
    with psycopg.connect(db_url) as conn:
        major = conn.execute("SHOW server_version_num").fetchone()[0][:-4]
    if f"-- Rendered from PostgreSQL {major}.\n" not in stored and stored:
        pytest.skip(
            f"sql/schema.sql was rendered by another PostgreSQL major version than this server's {major}"
        )
    if rendered != stored:
        diff = "".join(
            list(
                difflib.unified_diff(
                    stored.splitlines(keepends=True),
                    rendered.splitlines(keepends=True),
                    "sql/schema.sql (checked in)",
                    "what the migrations produce",
                )
            )[:60]
        )
        pytest.fail(
            "sql/schema.sql differs from the schema the migrations produce. Regenerate it and commit it:\n"
            f"    {schema_dump.REGENERATE}\n"
            "(or, reusing the test server: TUNEPLANE_WRITE_SCHEMA=1 and run this test once)\n\n" + diff,
            pytrace=False,
        )


def test_schema_file_is_rendered_from_the_catalogs_in_a_stable_order(db_url: str) -> None:
    # Two renders of one database are the same text, and hold every table of the schema.
    first, second = schema_dump.render(db_url), schema_dump.render(db_url)
    assert first == second
    with psycopg.connect(db_url) as conn:
        tables = conn.execute(
            "SELECT tablename FROM pg_tables WHERE schemaname = 'tuneplane' ORDER BY 1"
        ).fetchall()
    for (table,) in tables:
        assert f"CREATE TABLE tuneplane.{table} (" in first
