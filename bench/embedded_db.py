"""A private embedded PostgreSQL for a benchmark: started in a temporary directory, one database created
and migrated, stopped (and removed) afterwards. The numbers a bench prints are about this server only."""

from __future__ import annotations

import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import psycopg
from psycopg.conninfo import make_conninfo

from tuneplane.app import embedded_pg
from tuneplane.app.migrate import migrate


@contextmanager
def migrated_database(name: str = "bench") -> Iterator[str]:
    """The URL of a freshly migrated database on a private embedded server."""
    with tempfile.TemporaryDirectory() as tmp:
        pg = embedded_pg.start(Path(tmp) / "pg")
        try:
            with psycopg.connect(pg.url, autocommit=True) as conn:
                conn.execute(f"CREATE DATABASE {name}")
            url = make_conninfo(pg.url, dbname=name)
            migrate(url, progress=lambda _m: None)
            yield url
        finally:
            pg.stop()
