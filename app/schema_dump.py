"""sql/schema.sql: the `tuneplane` schema of a freshly migrated database, as one readable, normalised file.

A newcomer reads the current tables here instead of replaying 30 migrations in their head (Procrastinate
keeps its schema.sql the same way). It is generated, never edited: `tuneplane db schema` migrates an empty
database on a throw-away embedded PostgreSQL (or on --database-url's server, in a temporary database) and
writes the file; tests/db/test_schema_file.py fails when the checked-in file differs from what the
migrations produce.

Rendered from the catalogs rather than by pg_dump, so the file depends neither on a client binary nor on
its version's preamble: no ownership, no comments, no SET lines, every name schema-qualified (rendered
under search_path pg_catalog), objects sorted by name. Tables with their columns (identity, defaults,
NOT NULL), constraints, indexes, sequences, views and triggers. Function bodies are not here: they live,
commented, in sql/functions/ (the stored-function registry, app/db_functions.py, names those Python calls).
pgqueuer's tables (schema `public`) are pgqueuer's and left out.
"""

from __future__ import annotations

import contextlib
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo

SCHEMA = "tuneplane"
HEADER = """\
-- sql/schema.sql — GENERATED, do not edit. The `tuneplane` schema of a freshly migrated database:
-- tables, constraints, indexes, sequences, views, triggers. Functions live in sql/functions/.
-- Regenerate after adding a migration or changing a view or trigger:
--     PYTHONPATH=$PWD python -m tuneplane db schema
-- (tests/db/test_schema_file.py fails while this file differs from what the migrations produce).
"""
REGENERATE = "PYTHONPATH=$PWD /work/main/.venv/bin/python -m tuneplane db schema"


def render(url: str) -> str:
    """The schema file's text for the database at `url` (read-only; one transaction)."""
    with psycopg.connect(url, autocommit=False) as conn:
        conn.execute("SET LOCAL search_path = pg_catalog")
        major = conn.execute("SHOW server_version_num").fetchone()[0][:-4]
        out = [HEADER.rstrip("\n"), f"-- Rendered from PostgreSQL {major}.", ""]
        out += _sequences(conn)
        out += _tables(conn)
        out += _views(conn)
        out += _triggers(conn)
        conn.rollback()
    return "\n".join(out).rstrip("\n") + "\n"


def _sequences(conn: psycopg.Connection) -> list[str]:
    # Sequences behind identity columns are part of their column; the others are named here.
    rows = conn.execute(
        """
        SELECT quote_ident(c.relname) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
         WHERE n.nspname = %s AND c.relkind = 'S'
           AND NOT EXISTS (SELECT 1 FROM pg_depend d WHERE d.objid = c.oid AND d.deptype = 'i')
         ORDER BY c.relname
        """,
        (SCHEMA,),
    ).fetchall()
    if not rows:
        return []
    return ["-- Sequences", *[f"CREATE SEQUENCE {SCHEMA}.{r[0]};" for r in rows], ""]


def _tables(conn: psycopg.Connection) -> list[str]:
    out = ["-- Tables"]
    tables = conn.execute(
        """
        SELECT c.oid, quote_ident(c.relname), c.relkind, c.relpersistence FROM pg_class c
          JOIN pg_namespace n ON n.oid = c.relnamespace
         WHERE n.nspname = %s AND c.relkind IN ('r', 'p') ORDER BY c.relname
        """,
        (SCHEMA,),
    ).fetchall()
    for oid, name, _kind, persistence in tables:
        lines = []
        for col, typ, notnull, default, identity, generated in conn.execute(
            """
            SELECT quote_ident(a.attname), format_type(a.atttypid, a.atttypmod), a.attnotnull,
                   pg_get_expr(d.adbin, d.adrelid), a.attidentity, a.attgenerated
              FROM pg_attribute a LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
             WHERE a.attrelid = %s AND a.attnum > 0 AND NOT a.attisdropped ORDER BY a.attnum
            """,
            (oid,),
        ).fetchall():
            line = f"    {col} {typ}"
            if generated == "s":
                line += f" GENERATED ALWAYS AS ({default}) STORED"
            elif identity:
                line += " GENERATED " + ("ALWAYS" if identity == "a" else "BY DEFAULT") + " AS IDENTITY"
            elif default is not None:
                line += f" DEFAULT {default}"
            if notnull:
                line += " NOT NULL"
            lines.append(line)
        # 'n' (NOT NULL, a catalog row since PostgreSQL 18) is already said on its column.
        for con, definition in conn.execute(
            """
            SELECT quote_ident(conname), pg_get_constraintdef(oid, true) FROM pg_constraint
             WHERE conrelid = %s AND contype <> 'n'
             ORDER BY array_position(ARRAY['p', 'u', 'x', 'f', 'c']::"char"[], contype), conname
            """,
            (oid,),
        ).fetchall():
            lines.append(f"    CONSTRAINT {con} {definition}")
        unlogged = "UNLOGGED " if persistence == "u" else ""
        out.append(f"CREATE {unlogged}TABLE {SCHEMA}.{name} (")
        out.append(",\n".join(lines))
        out.append(");")
        indexes = conn.execute(
            """
            SELECT pg_get_indexdef(i.indexrelid) FROM pg_index i JOIN pg_class ic ON ic.oid = i.indexrelid
             WHERE i.indrelid = %s
               AND NOT EXISTS (SELECT 1 FROM pg_constraint k
                                WHERE k.conindid = i.indexrelid AND k.conrelid = i.indrelid)
             ORDER BY ic.relname
            """,
            (oid,),
        ).fetchall()
        out += [f"{r[0]};" for r in indexes]
        out.append("")
    return out


def _views(conn: psycopg.Connection) -> list[str]:
    rows = conn.execute(
        """
        SELECT quote_ident(c.relname), c.relkind, pg_get_viewdef(c.oid, true) FROM pg_class c
          JOIN pg_namespace n ON n.oid = c.relnamespace
         WHERE n.nspname = %s AND c.relkind IN ('v', 'm') ORDER BY c.relname
        """,
        (SCHEMA,),
    ).fetchall()
    out = ["-- Views (defined in sql/functions/)"]
    for name, kind, definition in rows:
        materialized = "MATERIALIZED " if kind == "m" else ""
        body = "\n".join(line.rstrip() for line in definition.rstrip().rstrip(";").splitlines())
        out += [f"CREATE {materialized}VIEW {SCHEMA}.{name} AS", f"{body};", ""]
    return out


def _triggers(conn: psycopg.Connection) -> list[str]:
    rows = conn.execute(
        """
        SELECT pg_get_triggerdef(t.oid, true) FROM pg_trigger t
          JOIN pg_class c ON c.oid = t.tgrelid JOIN pg_namespace n ON n.oid = c.relnamespace
         WHERE n.nspname = %s AND NOT t.tgisinternal ORDER BY c.relname, t.tgname
        """,
        (SCHEMA,),
    ).fetchall()
    return ["-- Triggers (their functions are in sql/functions/)", *[f"{r[0]};" for r in rows]]


@contextlib.contextmanager
def _server(database_url: str | None) -> Iterator[str]:
    """A server URL: the one given, or a throw-away embedded PostgreSQL (its data in a temporary dir)."""
    if database_url:
        yield database_url
        return
    from tuneplane.app import embedded_pg

    with tempfile.TemporaryDirectory(prefix="tp-schema-") as tmp:
        pg = embedded_pg.start(Path(tmp) / "pg")
        try:
            yield pg.url
        finally:
            pg.stop(even_if_reused=True)


def fresh_schema(database_url: str | None = None) -> str:
    """Migrate an empty database (a temporary one on `database_url`'s server, or on a throw-away embedded
    server) and render it; the temporary database is dropped afterwards."""
    from tuneplane.app.migrate import migrate

    with _server(database_url) as server:
        name = f"tp_schema_{uuid.uuid4().hex[:12]}"
        admin = make_conninfo(server, dbname=conninfo_to_dict(server).get("dbname") or "postgres")
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f"CREATE DATABASE {name}")
        try:
            url = make_conninfo(server, dbname=name)
            migrate(url, progress=lambda _m: None)
            return render(url)
        finally:
            with psycopg.connect(admin, autocommit=True) as conn:
                conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
