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
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import pytest

from tests.artifact_fixtures import MemberSetup, write_tree
from tests.db.test_artifacts_gateway import serve_gateway_routes
from tests.s3.test_s3_gateway import s3_fleet  # noqa: F401 - the fixture rig builds on
from tests.seaweed_store import assert_stored_verified, record_part_puts
from tuneplane.app.artifacts import s3_delivery
from tuneplane.app.artifacts.s3_gc import collect_s3
from tuneplane.app.db import Database
from tuneplane.app.s3store import MIN_PART_SIZE, SERVER_ONLY_ENV, S3Store
from tuneplane.workers.artifacts.deliver import deliver_artifact, node_http

PARTS = 8

AGENT = textwrap.dedent(
    """
    import json, sys, threading
    from pathlib import Path
    from tuneplane.workers.artifacts import s3_upload
    from tuneplane.workers.artifacts.deliver import deliver_artifact, node_http

    url, credential, member_id, root = json.loads(sys.argv[1])
    real_put, lock, sent = s3_upload.put_part, threading.Lock(), []

    def put_part(pool, target, data, headers):
        answer = real_put(pool, target, data, headers)
        with lock:  # every other part waits here once two are in the store, until kill -9
            sent.append(target)
            if len(sent) == 2:
                print("two parts in the store", flush=True)
                threading.Event().wait()
        return answer

    s3_upload.put_part = put_part
    with node_http(url, credential) as http:
        deliver_artifact(http, member_id, "checkpoint", Path(root), kind="checkpoint")
    """
)


@dataclass
class Rig:
    """test_s3_gateway's S3 fleet behind a running node gateway whose parts are S3's minimum size (several
    per test file without writing hundreds of MiB), and the agent's output directory."""

    setup: MemberSetup
    store: S3Store
    url: str
    out: Path

    def deliver(self) -> dict:
        with node_http(self.url, self.setup.credential) as http:
            return deliver_artifact(http, self.setup.member["id"], "checkpoint", self.out, kind="checkpoint")


@pytest.fixture
def rig(
    request: pytest.FixtureRequest, db_url: str, tmp_path: Path, port: int, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Rig]:
    real = s3_delivery.FleetStores.delivery

    def delivery(self, db, credential_hash, artifact_id):
        made = real(self, db, credential_hash, artifact_id)
        return s3_delivery.S3Delivery(made.db, made.store, part_size=MIN_PART_SIZE)

    monkeypatch.setattr(s3_delivery.FleetStores, "delivery", delivery)
    setup, store = request.getfixturevalue("s3_fleet")
    with serve_gateway_routes(db_url, tmp_path / "blobs", port) as url:
        yield Rig(setup, store, url, tmp_path / "out")


def _state(db: Database, artifact_id: int) -> str:
    return db.fetch_one("SELECT state FROM artifacts WHERE id = %s", (artifact_id,))["state"]


def _collected_and_verified(db: Database, store: S3Store, artifact_id: int) -> None:
    """The next GC aborts nothing (no upload was left open), and the artifact's objects verify in place."""
    assert collect_s3(db, store, min_age=0).aborted_uploads == 0
    assert_stored_verified(db, store, artifact_id)


def _agent_killed_9_after_two_parts(db: Database, rig: Rig) -> tuple[dict, list[dict]]:
    """Run the agent in its own process (no store keys) until two parts are in the store, kill -9 it;
    returns its artifact (uploading) and the parts the store holds of its open upload."""
    env = {k: v for k, v in os.environ.items() if k not in SERVER_ONLY_ENV}  # a node: no store keys
    args = json.dumps([rig.url, rig.setup.credential, rig.setup.member["id"], str(rig.out)])
    agent = subprocess.Popen([sys.executable, "-c", AGENT, args], stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert agent.stdout is not None and agent.stdout.readline().strip() == "two parts in the store"
    finally:
        agent.kill()  # SIGKILL
        agent.wait()
    (art,) = db.fetch_all("SELECT id, state FROM artifacts WHERE member_id = %s", (rig.setup.member["id"],))
    assert art["state"] == "uploading"
    (upload,) = rig.store.open_uploads("artifacts/")
    held = rig.store.list_parts(upload["Key"], upload["UploadId"])
    assert 2 <= len(held) < PARTS
    return art, held


def test_agent_killed_9_mid_upload_resumes_without_resending_parts(
    db: Database, rig: Rig, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_tree(rig.out, {"weights.bin": os.urandom(PARTS * MIN_PART_SIZE)})
    art, held = _agent_killed_9_after_two_parts(db, rig)
    sent = record_part_puts(monkeypatch)
    done = rig.deliver()  # the restarted agent
    assert done["state"] == "complete" and done["id"] == art["id"]
    # Only parts the store did not hold: none of those it listed after the kill is sent again (a part whose
    # body had fully arrived may still have been stored just after that listing, so at most the rest).
    numbers = {int(parse_qs(urlsplit(u).query)["partNumber"][0]) for u in sent}
    assert not numbers & {p["PartNumber"] for p in held} and len(sent) <= PARTS - len(held)
    _collected_and_verified(db, rig.store, art["id"])


def test_store_killed_mid_upload_never_completes_then_the_next_try_does(
    db: Database, rig: Rig, seaweed, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_tree(rig.out, {"weights.bin": os.urandom(3 * MIN_PART_SIZE)})

    def kill_once(_url: str) -> None:
        if seaweed.process is not None:
            seaweed.kill()  # kill -9 of the store after its first part

    with monkeypatch.context() as patch:
        record_part_puts(patch, then=kill_once)
        try:
            first = rig.deliver()
            # The agent keeps the artifact uploading with the reason (its delivery tries again later).
            assert first["state"] == "uploading" and "store did not answer" in first["reason"], first
            assert _state(db, first["id"]) == "uploading"
        finally:
            seaweed.restart()
    again = rig.deliver()
    assert again["state"] == "complete" and again["id"] == first["id"]
    _collected_and_verified(db, rig.store, again["id"])


def test_agent_killed_9_for_good_the_next_gc_aborts_its_upload(db: Database, rig: Rig) -> None:
    """The agent never comes back: its node is fenced, so its member is lost and the artifact fails
    (artifacts_of_lost_member); the next collection aborts the open multipart upload (its parts' bytes)."""
    write_tree(rig.out, {"weights.bin": os.urandom(PARTS * MIN_PART_SIZE)})
    art, _ = _agent_killed_9_after_two_parts(db, rig)
    assert collect_s3(db, rig.store, min_age=0).aborted_uploads == 0  # still uploading: it may resume
    node = db.fetch_one("SELECT name FROM nodes WHERE id = %s", (rig.setup.node_id,))["name"]
    db.call("fence_node", node, "the machine died")
    assert _state(db, art["id"]) == "failed"
    report = collect_s3(db, rig.store, min_age=0)
    assert report.aborted_uploads == 1 and report.upload_keys == [rig.store.key(f"artifacts/{art['id']}/0")]
    assert rig.store.open_uploads() == [] and list(rig.store.list_keys("artifacts/")) == []
