"""Issue 32's kill cases through the agent's own delivery code, the node gateway's routes and a real
SeaweedFS: an agent killed with -9 mid-upload resumes (the parts the store holds are not sent again); the
store killed mid-upload leaves the artifact uploading, never complete, and the next try completes it; and
the next GC leaves no multipart upload open. The agent runs without the store's keys."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import httpx
import pytest

from tests.artifact_fixtures import write_tree
from tests.db.test_artifacts_gateway import serve_gateway_routes
from tests.s3.test_s3_gateway import s3_fleet  # noqa: F401 - the fixture small_parts builds on
from tests.seaweed_store import assert_stored_verified
from tuneplane.app.artifacts import s3_delivery
from tuneplane.app.artifacts.s3_gc import collect_s3
from tuneplane.app.db import Database
from tuneplane.app.s3store import MIN_PART_SIZE, SERVER_ONLY_ENV
from tuneplane.workers.artifacts.deliver import deliver_artifact, node_http

PARTS = 8

AGENT = textwrap.dedent(
    """
    import json, sys, threading
    from pathlib import Path
    import httpx
    from tuneplane.workers.artifacts.deliver import deliver_artifact, node_http

    url, credential, member_id, root, store_url = json.loads(sys.argv[1])
    real_put, lock, sent = httpx.Client.put, threading.Lock(), []

    def put(self, target, **kw):
        answer = real_put(self, target, **kw)
        if str(target).startswith(store_url):
            with lock:  # every other part waits here once two are in the store, until kill -9
                sent.append(target)
                if len(sent) == 2:
                    print("two parts in the store", flush=True)
                    threading.Event().wait()
        return answer

    httpx.Client.put = put
    with node_http(url, credential) as http:
        deliver_artifact(http, member_id, "checkpoint", Path(root), kind="checkpoint")
    """
)


@pytest.fixture
def small_parts(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch):
    """test_s3_gateway's S3 fleet, its gateway cutting parts of S3's minimum size (several per test file
    without writing hundreds of MiB)."""
    real = s3_delivery.FleetStores.delivery

    def delivery(self, db, credential_hash, artifact_id):
        made = real(self, db, credential_hash, artifact_id)
        return s3_delivery.S3Delivery(made.db, made.store, part_size=MIN_PART_SIZE)

    monkeypatch.setattr(s3_delivery.FleetStores, "delivery", delivery)
    return request.getfixturevalue("s3_fleet")


def _state(db: Database, artifact_id: int) -> str:
    return db.fetch_one("SELECT state FROM artifacts WHERE id = %s", (artifact_id,))["state"]


def test_agent_killed_9_mid_upload_resumes_without_resending_parts(
    db: Database,
    db_url: str,
    tmp_path: Path,
    port: int,
    seaweed,
    small_parts,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    setup, store = small_parts
    data = os.urandom(PARTS * MIN_PART_SIZE)
    write_tree(tmp_path / "out", {"weights.bin": data})
    with serve_gateway_routes(db_url, tmp_path / "blobs", port) as url:
        env = {k: v for k, v in os.environ.items() if k not in SERVER_ONLY_ENV}  # a node: no store keys
        args = json.dumps(
            [url, setup.credential, setup.member["id"], str(tmp_path / "out"), seaweed.endpoint]
        )
        agent = subprocess.Popen(
            [sys.executable, "-c", AGENT, args], stdout=subprocess.PIPE, text=True, env=env
        )
        try:
            assert agent.stdout is not None and agent.stdout.readline().strip() == "two parts in the store"
        finally:
            agent.kill()  # SIGKILL
            agent.wait()
        (art,) = db.fetch_all("SELECT id, state FROM artifacts WHERE member_id = %s", (setup.member["id"],))
        assert art["state"] == "uploading"
        (upload,) = store.open_uploads("artifacts/")
        held = store.list_parts(upload["Key"], upload["UploadId"])
        assert 2 <= len(held) < PARTS

        sent: list[str] = []
        real_put = httpx.Client.put

        def counting_put(self, target, **kw):
            if str(target).startswith(seaweed.endpoint):
                sent.append(str(target))
            return real_put(self, target, **kw)

        monkeypatch.setattr(httpx.Client, "put", counting_put)
        with node_http(url, setup.credential) as http:  # the restarted agent
            done = deliver_artifact(
                http, setup.member["id"], "checkpoint", tmp_path / "out", kind="checkpoint"
            )
    assert done["state"] == "complete" and done["id"] == art["id"]
    # Only parts the store did not hold: none of those it listed after the kill is sent again (a part whose
    # body had fully arrived may still have been stored just after that listing, so at most the rest).
    numbers = {int(parse_qs(urlsplit(u).query)["partNumber"][0]) for u in sent}
    assert not numbers & {p["PartNumber"] for p in held} and len(sent) <= PARTS - len(held)
    assert collect_s3(db, store, min_age=0).aborted_uploads == 0
    assert_stored_verified(db, store, art["id"])


def test_store_killed_mid_upload_never_completes_then_the_next_try_does(
    db: Database,
    db_url: str,
    tmp_path: Path,
    port: int,
    seaweed,
    small_parts,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    setup, store = small_parts
    data = os.urandom(3 * MIN_PART_SIZE)
    write_tree(tmp_path / "out", {"weights.bin": data})
    real_put = httpx.Client.put
    killed: list[bool] = []

    def put_then_kill(self, target, **kw):
        answer = real_put(self, target, **kw)
        if str(target).startswith(seaweed.endpoint) and not killed:
            killed.append(True)
            seaweed.kill()  # kill -9 of the store after its first part
        return answer

    with (
        serve_gateway_routes(db_url, tmp_path / "blobs", port) as url,
        node_http(url, setup.credential) as http,
    ):
        monkeypatch.setattr(httpx.Client, "put", put_then_kill)
        try:
            first = deliver_artifact(
                http, setup.member["id"], "checkpoint", tmp_path / "out", kind="checkpoint"
            )
            # The agent keeps the artifact uploading with the reason (its delivery tries again later).
            assert killed and first["state"] == "uploading" and "store did not answer" in first["reason"]
            assert _state(db, first["id"]) == "uploading"
        finally:
            monkeypatch.setattr(httpx.Client, "put", real_put)
            seaweed.restart()
        again = deliver_artifact(http, setup.member["id"], "checkpoint", tmp_path / "out", kind="checkpoint")
    assert again["state"] == "complete" and again["id"] == first["id"]
    collect_s3(db, store, min_age=0)
    assert_stored_verified(db, store, again["id"])
