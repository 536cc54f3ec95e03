"""Fixtures shared by the end-to-end tests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.launch_cluster import Cluster
from tuneplane.app.db import Database


@pytest.fixture
def cluster(db_url: str, db: Database, tmp_path: Path, port: int) -> Iterator[Cluster]:
    """A node gateway on a fresh database with fast thresholds; tests add agents and workers."""
    c = Cluster(db_url, db, tmp_path, port)
    c.start()
    try:
        yield c
    finally:
        c.stop_all()
