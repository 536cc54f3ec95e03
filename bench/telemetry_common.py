"""Shared set-up for the telemetry benchmarks: a private embedded PostgreSQL in a temporary directory
(or the server named by --database-url), migrated, with one user, one job and a member token."""

from __future__ import annotations

import shutil
import sys
import tempfile
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.telemetry_support import make_job, make_user, member_token  # noqa: E402
from tuneplane.app.db import Database  # noqa: E402
from tuneplane.app.migrate import migrate  # noqa: E402


@contextmanager
def bench_database(database_url: str | None) -> Iterator[str]:
    if database_url:
        migrate(database_url, progress=lambda _m: None)
        yield database_url
        return
    from tuneplane.app import embedded_pg

    tmp = Path(tempfile.mkdtemp(prefix="tp-bench-telemetry-"))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        pg = embedded_pg.start(tmp / "pg")
    try:
        migrate(pg.url, progress=lambda _m: None)
        yield pg.url
    finally:
        pg.stop()
        shutil.rmtree(tmp, ignore_errors=True)


def job_with_token(url: str, user: str = "bench") -> tuple[int, str]:
    db = Database(url, max_size=2)
    try:
        job = make_job(db, make_user(db, user))
        return job, member_token(db, job)
    finally:
        db.close()


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[index]
