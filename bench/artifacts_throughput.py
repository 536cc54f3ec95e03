"""Artifact delivery throughput next to a plain file copy of the same bytes, on this machine.

Starts an embedded PostgreSQL and a real `tuneplane server` process, uploads a directory of random
files as an artifact (chunked, each chunk hashed and fsynced, every file re-hashed by the server before
`complete`), asks the server to verify it (recompute every file), downloads it with the CLI's verified
download, and copies the same files with shutil.copyfile + fsync. Prints MiB/s for each and the ratios.

Run: .venv/bin/python bench/artifacts_throughput.py [--mib 256] [--files 4] [--chunk-mib 8]
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import httpx  # noqa: E402

from app import embedded_pg  # noqa: E402
from app.client.config import ClientConfig  # noqa: E402
from app.client.http import ApiClient  # noqa: E402
from app.db import Database  # noqa: E402
from app.migrate import migrate  # noqa: E402
from tests.artifact_fixtures import api_token, make_member  # noqa: E402
from tests.conftest import free_port  # noqa: E402
from tests.helpers import wait_for  # noqa: E402
from workers.artifacts.deliver import deliver_artifact, node_http  # noqa: E402


def fsync_tree(root: Path) -> None:
    for path in root.rglob("*"):
        if path.is_file():
            with open(path, "rb") as handle:
                os.fsync(handle.fileno())


def plain_copy(src: Path, dst: Path) -> None:
    for path in sorted(src.rglob("*")):
        if path.is_file():
            target = dst / path.relative_to(src)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, target)
    fsync_tree(dst)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mib", type=int, default=256, help="total artifact size")
    parser.add_argument("--files", type=int, default=4)
    parser.add_argument("--chunk-mib", type=int, default=8)
    args = parser.parse_args()
    total = args.mib * 1024 * 1024
    with tempfile.TemporaryDirectory(prefix="tp-bench-artifacts-") as tmp_name:
        tmp = Path(tmp_name)
        pg = embedded_pg.start(tmp / "pg")
        server = None
        try:
            migrate(pg.url, progress=lambda _m: None)
            db = Database(pg.url, max_size=4)
            db.fetch_one(
                "UPDATE artifact_settings SET chunk_size = %s RETURNING 1", (args.chunk_mib * 1024 * 1024,)
            )
            setup = make_member(db)
            token = api_token(db, setup.user_id)
            port = free_port()
            server = subprocess.Popen(
                [sys.executable, "-m", "app", "server", "--port", str(port), "--database-url", pg.url,
                 "--data-dir", str(tmp / "data")],
                cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            )  # fmt: skip
            url = f"http://127.0.0.1:{port}"
            wait_for(lambda: _up(url), timeout=60, what="server")

            src = tmp / "src"
            src.mkdir()
            per_file = total // args.files
            for i in range(args.files):
                with open(src / f"shard-{i:02d}.bin", "wb") as handle:
                    for _ in range(0, per_file, 1024 * 1024):
                        handle.write(os.urandom(min(1024 * 1024, per_file)))
            size = sum(p.stat().st_size for p in src.iterdir())
            mib = size / 2**20

            start = time.perf_counter()
            plain_copy(src, tmp / "copy")
            copy_s = time.perf_counter() - start

            with node_http(url, setup.credential, timeout=600) as http:
                start = time.perf_counter()
                art = deliver_artifact(http, setup.member["id"], "bench", src)
                upload_s = time.perf_counter() - start
            assert art["state"] == "complete", art

            with httpx.Client(
                base_url=url,
                headers={"Authorization": f"Bearer {token}", "Accept": "application/json"},
                timeout=600,
            ) as client:
                start = time.perf_counter()
                report = client.post(f"/artifacts/{art['id']}/verify").json()
                verify_s = time.perf_counter() - start
            assert report["ok"], report

            from app.cli.artifacts_cmd import download_file

            api = ApiClient(ClientConfig(url, token), timeout=600)
            files = api.get(f"/artifacts/{art['id']}")["files"]
            start = time.perf_counter()
            for entry in files:
                download_file(api, art["id"], entry, tmp / "download")
            download_s = time.perf_counter() - start
            api.close()
        finally:
            if server is not None:
                server.terminate()
                server.wait(timeout=10)
            pg.stop()

    print(
        f"artifact of {args.files} files, {mib:.0f} MiB, chunks of {args.chunk_mib} MiB, "
        f"on {os.cpu_count()} CPUs"
    )
    rows = [
        ("plain copy (copyfile + fsync)", copy_s),
        ("upload + server verification → complete", upload_s),
        ("server verify (recompute every file)", verify_s),
        ("verified download", download_s),
    ]
    for label, seconds in rows:
        print(f"  {label:<42} {seconds:7.2f} s  {mib / seconds:8.1f} MiB/s")
    print(f"ratio upload/copy: {upload_s / copy_s:.2f}×   verify/copy: {verify_s / copy_s:.2f}×   "
          f"download/copy: {download_s / copy_s:.2f}×")  # fmt: skip


def _up(url: str) -> bool:
    try:
        return httpx.get(f"{url}/healthz", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


if __name__ == "__main__":
    main()
