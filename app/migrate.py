"""Numbered plain-SQL migrations, applied in order, each in its own transaction, recorded with a checksum;
then the repeatable function files.

Two `tuneplane db migrate` at once are safe: the whole run holds a session advisory lock, so the second
waits and then finds nothing pending. A migration that changed after it was applied is refused by name.
pgqueuer's own tables are installed and upgraded in the same run from the SQL pgqueuer itself emits.

Tables and data live in the frozen, numbered migrations; the *current* definition of every function, view
and trigger lives once, in sql/functions/<lifecycle>.sql (ADR 0012). Those files are re-applied, all of
them in the order of sql/functions/order.txt and in one transaction, whenever any checksum differs from
what the database recorded, like Flyway's repeatable `R__` migrations.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import psycopg

from tuneplane.app.db import connect
from tuneplane.app.resources import resource_dir

# An arbitrary constant: the key of the session advisory lock that serializes migration runs.
MIGRATION_LOCK_KEY = 7_402_911_339
_NAME = re.compile(r"^(\d{4})_([a-z0-9_]+)\.sql$")


class MigrationError(RuntimeError):
    """The migrations on disk and in the database disagree; the message says which file and how."""


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    path: Path

    @property
    def checksum(self) -> str:
        return hashlib.sha256(self.path.read_bytes()).hexdigest()


@dataclass(frozen=True)
class MigrationStatus:
    version: int
    name: str
    state: str  # applied | pending | changed | missing-file
    applied_at: str | None = None


def discover(migrations_dir: Path | None = None) -> list[Migration]:
    directory = migrations_dir or resource_dir("sql") / "migrations"
    found: dict[int, Migration] = {}
    for path in sorted(directory.glob("*.sql")):
        match = _NAME.match(path.name)
        if not match:
            raise MigrationError(f"{path.name}: migration files are named NNNN_lowercase_words.sql")
        version = int(match.group(1))
        if version in found:
            raise MigrationError(f"{path.name}: version {version} is also used by {found[version].path.name}")
        found[version] = Migration(version, path.stem, path)
    return [found[v] for v in sorted(found)]


@dataclass(frozen=True)
class FunctionFile:
    name: str
    path: Path

    @property
    def checksum(self) -> str:
        return hashlib.sha256(self.path.read_bytes()).hexdigest()


def discover_functions(functions_dir: Path | None = None) -> list[FunctionFile]:
    """The repeatable files in apply order; a .sql file missing from order.txt (or the reverse) is refused."""
    directory = functions_dir or resource_dir("sql") / "functions"
    order_file = directory / "order.txt"
    if not order_file.is_file():
        return []
    names = [
        line.strip()
        for line in order_file.read_text().splitlines()
        if line.strip() and not line.lstrip().startswith("#")
    ]
    on_disk = {p.name for p in directory.glob("*.sql")}
    for name in sorted(on_disk - set(names)):
        raise MigrationError(f"sql/functions/{name} is not listed in sql/functions/order.txt")
    for name in names:
        if name not in on_disk:
            raise MigrationError(f"sql/functions/order.txt lists {name}, which does not exist")
    return [FunctionFile(name, directory / name) for name in names]


def _applied_functions(conn: psycopg.Connection) -> dict[str, str] | None:
    """name -> checksum of the applied function files; None before migration 0060 created the table."""
    exists = conn.execute(
        "SELECT to_regclass('tuneplane.schema_repeatables') IS NOT NULL AS present"
    ).fetchone()
    if not exists["present"]:
        return None
    rows = conn.execute("SELECT name, checksum FROM tuneplane.schema_repeatables").fetchall()
    return {row["name"]: row["checksum"] for row in rows}


def _functions_current(files: list[FunctionFile], applied: dict[str, str] | None) -> bool:
    return applied is not None and applied == {f.name: f.checksum for f in files}


def _apply_functions(
    conn: psycopg.Connection, files: list[FunctionFile], progress: Callable[[str], None]
) -> bool:
    applied = _applied_functions(conn)
    if applied is None or not files or _functions_current(files, applied):
        return False
    changed = [f.name for f in files if applied.get(f.name) != f.checksum] or ["(removed files)"]
    progress(f"applying function files ({', '.join(changed)} changed)")
    with conn.transaction():
        for f in files:
            try:
                conn.execute(f.path.read_text())
            except psycopg.Error as exc:
                raise MigrationError(f"sql/functions/{f.name}: {exc}") from exc
        conn.execute("DELETE FROM tuneplane.schema_repeatables")
        for f in files:
            conn.execute(
                "INSERT INTO tuneplane.schema_repeatables (name, checksum) VALUES (%s, %s)",
                (f.name, f.checksum),
            )
    return True


def _applied(conn: psycopg.Connection) -> dict[int, dict]:
    exists = conn.execute(
        "SELECT to_regclass('tuneplane.schema_migrations') IS NOT NULL AS present"
    ).fetchone()
    if not exists["present"]:
        return {}
    rows = conn.execute(
        "SELECT version, name, checksum, applied_at FROM tuneplane.schema_migrations"
    ).fetchall()
    return {row["version"]: row for row in rows}


def _pgqueuer_sql() -> tuple[str, str, str]:
    """(version, install SQL, upgrade SQL) for the pinned pgqueuer."""
    from pgqueuer import __version__ as pgq_version
    from pgqueuer.adapters.persistence import qb, schema_ddl

    settings = qb.DBSettings()
    install = schema_ddl.render_install(settings, create_schema=False)
    upgrade = "\n\n".join(schema_ddl.render_converge(settings))
    return pgq_version, install, upgrade


def _verify(migrations: list[Migration], applied: dict[int, dict]) -> None:
    by_version = {m.version: m for m in migrations}
    for version, row in sorted(applied.items()):
        migration = by_version.get(version)
        if migration is None:
            continue  # applied by a newer release; status shows it as missing-file
        if migration.checksum != row["checksum"]:
            raise MigrationError(
                f"{migration.path.name} was changed after it was applied (checksum differs); landed "
                "migrations are never edited: restore the file and put the change in a new migration"
            )


def migrate(
    url: str,
    migrations_dir: Path | None = None,
    progress: Callable[[str], None] = print,
    functions_dir: Path | None = None,
) -> list[str]:
    """Apply every pending migration, install/upgrade pgqueuer, then re-apply the function files if any
    changed; returns what was applied."""
    migrations = discover(migrations_dir)
    function_files = discover_functions(functions_dir)
    done: list[str] = []
    with connect(url, autocommit=True, application_name="tuneplane-migrate") as conn:
        conn.execute("SELECT pg_advisory_lock(%s)", (MIGRATION_LOCK_KEY,))
        try:
            applied = _applied(conn)
            _verify(migrations, applied)
            for migration in migrations:
                if migration.version in applied:
                    continue
                progress(f"applying {migration.path.name}")
                with conn.transaction():
                    conn.execute(migration.path.read_text())
                    conn.execute(
                        "INSERT INTO tuneplane.schema_migrations (version, name, checksum)"
                        " VALUES (%s, %s, %s)",
                        (migration.version, migration.name, migration.checksum),
                    )
                done.append(migration.path.name)
            if _install_pgqueuer(conn, progress):
                done.append("pgqueuer")
            if _apply_functions(conn, function_files, progress):
                done.append("sql/functions")
        finally:
            conn.execute("SELECT pg_advisory_unlock(%s)", (MIGRATION_LOCK_KEY,))
    return done


def _install_pgqueuer(conn: psycopg.Connection, progress: Callable[[str], None]) -> bool:
    if conn.execute("SELECT to_regclass('tuneplane.schema_components') IS NULL AS absent").fetchone()[
        "absent"
    ]:
        return False
    version, install, upgrade = _pgqueuer_sql()
    row = conn.execute("SELECT version FROM tuneplane.schema_components WHERE name = 'pgqueuer'").fetchone()
    if row is not None and row["version"] == version:
        return False
    script = install if row is None else upgrade
    progress(f"{'installing' if row is None else 'upgrading'} pgqueuer {version}")
    with conn.transaction():
        # pgqueuer lives in public, next to (not inside) the tuneplane schema.
        conn.execute("SET LOCAL search_path = public")
        conn.execute(script)
        conn.execute(
            """INSERT INTO tuneplane.schema_components (name, version, checksum) VALUES ('pgqueuer', %s, %s)
               ON CONFLICT (name) DO UPDATE SET version = EXCLUDED.version, checksum = EXCLUDED.checksum,
                                                applied_at = now()""",
            (version, hashlib.sha256(script.encode()).hexdigest()),
        )
    return True


def status(url: str, migrations_dir: Path | None = None) -> list[MigrationStatus]:
    migrations = discover(migrations_dir)
    with connect(url, application_name="tuneplane-migrate") as conn:
        applied = _applied(conn)
    result = []
    for m in migrations:
        row = applied.get(m.version)
        if row is None:
            result.append(MigrationStatus(m.version, m.name, "pending"))
        else:
            state = "applied" if row["checksum"] == m.checksum else "changed"
            result.append(MigrationStatus(m.version, m.name, state, row["applied_at"].isoformat()))
    known = {m.version for m in migrations}
    for version, row in sorted(applied.items()):
        if version not in known:
            result.append(
                MigrationStatus(version, row["name"], "missing-file", row["applied_at"].isoformat())
            )
    return sorted(result, key=lambda s: s.version)


def functions_status(url: str, functions_dir: Path | None = None) -> list[MigrationStatus]:
    """One row per repeatable function file: applied (checksum equal), changed, or pending."""
    files = discover_functions(functions_dir)
    with connect(url, application_name="tuneplane-migrate") as conn:
        applied = _applied_functions(conn) or {}
    return [
        MigrationStatus(
            0,
            f"functions/{f.name}",
            "pending" if f.name not in applied else "applied" if applied[f.name] == f.checksum else "changed",
        )
        for f in files
    ]


def require_current(url: str) -> None:
    """Refuse to run a server or worker against a schema that is behind or ahead of this code."""
    problems = [s for s in status(url) + functions_status(url) if s.state != "applied"]
    if problems:
        first = problems[0]
        label = first.name if first.version == 0 else f"{first.version:04d}_{first.name}"
        raise MigrationError(
            f"database schema is not current ({label} is {first.state}); run `tuneplane db migrate`"
        )
