"""Against `tuneplane up`: `tuneplane submit --recipe demo --yes --json --retry-key k1` prints a receipt,
and running it again with the same key prints the same job id."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.e2e.up_process import tuneplane_up
from tuneplane.app.db import Database

pytestmark = pytest.mark.e2e


def test_submit_demo_twice_with_one_retry_key_is_one_job(db_url: str, db: Database, tmp_path: Path) -> None:
    with tuneplane_up(db_url, tmp_path, db) as up:

        def submit() -> dict:
            result = up.cli("submit", "--recipe", "demo", "--yes", "--json", "--retry-key", "k1", timeout=60)
            assert result.returncode == 0, result.stdout + result.stderr
            return json.loads(result.stdout)

        first = submit()
        second = submit()
        assert first["job_id"] == second["job_id"]
        assert not first["replayed"] and second["replayed"]
        assert db.fetch_one("SELECT count(*) AS n FROM jobs")["n"] == 1
