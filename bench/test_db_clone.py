"""How long a per-test database costs: clone from a migrated template vs. migrating a fresh database.

Run: .venv/bin/python bench/test_db_clone.py [--rounds 20]
Prints the median of each and the ratio (clone / migrate) measured in the same run.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from psycopg.conninfo import conninfo_to_dict, make_conninfo
from pytest_postgresql.janitor import DatabaseJanitor

from tuneplane.app import embedded_pg
from tuneplane.app.migrate import migrate


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=20)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        pg = embedded_pg.start(Path(tmp) / "pg")
        try:
            info = conninfo_to_dict(pg.url)
            common = {
                "user": info.get("user", "postgres"),
                "host": info["host"],
                "port": info.get("port", 5432),
            }
            template = DatabaseJanitor(dbname="bench_tmpl", as_template=True, **common)
            template.init()
            migrate(make_conninfo(pg.url, dbname="bench_tmpl"), progress=lambda _m: None)
            clone_times, migrate_times = [], []
            for i in range(args.rounds):
                started = time.perf_counter()
                clone = DatabaseJanitor(dbname=f"bench_clone_{i}", template_dbname="bench_tmpl", **common)
                clone.init()
                clone_times.append(time.perf_counter() - started)
                clone.drop()
                started = time.perf_counter()
                fresh = DatabaseJanitor(dbname=f"bench_fresh_{i}", **common)
                fresh.init()
                migrate(make_conninfo(pg.url, dbname=f"bench_fresh_{i}"), progress=lambda _m: None)
                migrate_times.append(time.perf_counter() - started)
                fresh.drop()
            template.drop()
        finally:
            pg.stop()
    clone_ms, migrate_ms = statistics.median(clone_times) * 1000, statistics.median(migrate_times) * 1000
    print(
        f"per-test database, median of {args.rounds}: clone from template {clone_ms:.1f} ms; "
        f"create + migrate {migrate_ms:.1f} ms; ratio clone/migrate = {clone_ms / migrate_ms:.2f}"
    )


if __name__ == "__main__":
    main()
