"""Issue 15 acceptance: 50 uploads of a source archive with a 200 MiB PAX header each (about 200 KiB
compressed, generated as a stream) leave the console server's memory flat: RSS grows by < 100 MiB."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from tests import archive_builders as ab
from tests.e2e.server_processes import running_servers
from tests.submission_setup import add_user
from tuneplane.app.db import Database

pytestmark = pytest.mark.e2e


def test_fifty_uploads_with_a_200_mib_pax_header_keep_the_server_flat(
    db_url: str, db: Database, tmp_path: Path
) -> None:
    add_user(db, "alice", password="alice-pw")
    with db.transaction() as conn:  # the header alone is within the decompressed-size limit
        conn.execute(
            "UPDATE submission_settings SET value = 1024 * 1024 * 1024"
            " WHERE name = 'archive_max_unpacked_bytes'"
        )
    archive = ab.huge_extended_header(200 * 1024**2)
    with running_servers(db_url, tmp_path / "data", names=("console",)) as servers:
        console = servers.console
        token = httpx.post(
            console.url + "/api/tokens", json={"username": "alice", "password": "alice-pw"}, timeout=30
        ).json()["token"]
        headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/gzip",
                   "Accept": "application/json"}  # fmt: skip
        # One upload first, so that the baseline includes what any request loads (modules, pools).
        warm = httpx.post(console.url + "/sources", content=archive, headers=headers, timeout=60)
        assert warm.status_code == 422, warm.text
        baseline = console.rss_bytes()

        def upload(_: int) -> httpx.Response:
            return httpx.post(console.url + "/sources", content=archive, headers=headers, timeout=120)

        with ThreadPoolExecutor(max_workers=10) as pool:
            answers = list(pool.map(upload, range(50)))
        grown = console.rss_bytes() - baseline
    assert {a.status_code for a in answers} == {422}
    assert all("extended header" in a.json()["error"] for a in answers)
    print(f"console RSS grew by {grown / 1024**2:.1f} MiB over 50 uploads (archive {len(archive)} bytes)")
    assert grown < 100 * 1024**2
    assert db.fetch_one("SELECT count(*) AS n FROM source_archives")["n"] == 0
