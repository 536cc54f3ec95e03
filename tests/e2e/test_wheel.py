"""The wheel carries sql/, templates/ and static/: install it in a fresh venv and run it from there."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.e2e, pytest.mark.slow]


def test_wheel_installs_and_migrates_from_a_fresh_venv(tmp_path: Path, empty_db_url: str) -> None:
    dist = tmp_path / "dist"
    subprocess.run(
        [sys.executable, "-m", "build", "--wheel", "--outdir", str(dist), str(REPO)],
        check=True,
        capture_output=True,
    )
    wheel = next(dist.glob("tuneplane-*.whl"))
    names = zipfile.ZipFile(wheel).namelist()
    for needed in (
        "tuneplane/app/_data/sql/migrations/0001_foundation.sql",
        "tuneplane/app/_data/templates/base.html",
        "tuneplane/app/_data/static/htmx.min.js",
        "tuneplane/app/_data/static/htmx.LICENSE",
        "tuneplane/workers/runner/containers.conf",
        "tuneplane/sdk.py",
        "tuneplane/__main__.py",
    ):
        assert needed in names
    # One namespace: nothing named app or workers (or anything else) at the top of site-packages.
    top = {name.split("/", 1)[0] for name in names if not name.split("/", 1)[0].endswith(".dist-info")}
    assert top == {"tuneplane"}, top
    assert not [name for name in names if "__pycache__" in name or name.endswith(".pyc")]

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    subprocess.run([str(venv / "bin" / "pip"), "install", "-q", str(wheel)], check=True, capture_output=True)
    tuneplane = str(venv / "bin" / "tuneplane")
    # Run from an unrelated directory so nothing is imported from the checkout.
    help_out = subprocess.run([tuneplane, "--help"], cwd=tmp_path, check=True, capture_output=True, text=True)
    assert (
        "migrate"
        in subprocess.run([tuneplane, "db", "--help"], cwd=tmp_path, capture_output=True, text=True).stdout
    )
    assert "up" in help_out.stdout
    migrated = subprocess.run(
        [tuneplane, "db", "migrate", "--database-url", empty_db_url],
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )
    assert migrated.returncode == 0, migrated.stderr
    assert "applying 0001_foundation.sql" in migrated.stdout
    where = subprocess.run(
        [
            str(venv / "bin" / "python"),
            "-c",
            "from tuneplane.app.resources import resource_dir; print(resource_dir('templates'))",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert str(venv) in where
