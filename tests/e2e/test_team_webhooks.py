"""Team webhooks end to end: a real agent runs the jobs, the real backend worker places and launches them
and sends the webhook events, a real HTTP receiver in the test takes them."""

from __future__ import annotations

import io
import uuid
from datetime import timedelta

import pytest

from tests.e2e.launch_cluster import MIB, Cluster, source_archive
from tests.helpers import wait_for
from tests.submission_setup import add_user
from tests.webhook_receiver import Receiver
from tuneplane.app.blobstore import FilesystemBlobStore
from tuneplane.app.submission import archives, service
from tuneplane.app.webhook_signature import SIGNATURE_HEADER, verify

pytestmark = pytest.mark.e2e

SECRET = "e2e-webhook-secret-0123"


@pytest.fixture(autouse=True)
def loopback_allowed(monkeypatch: pytest.MonkeyPatch) -> None:
    """The receiver listens on loopback, which the webhook target policy refuses unless the operator
    opens it (app/webhook_targets.py): these tests run with the allow-list set to 127.0.0.1."""
    monkeypatch.setenv("TUNEPLANE_WEBHOOK_ALLOW", "127.0.0.1")


def _submit_as(cluster: Cluster, user_id: int) -> int:
    blobs = FilesystemBlobStore(cluster.data_dir / "blobs")
    archive = archives.receive_archive(
        cluster.db, blobs, user_id, io.BytesIO(source_archive({"hi.py": "print('hi', flush=True)\n"}))
    ).sha256
    spec = {
        "fleet": cluster.fleet,
        "source": {"archive": archive, "entrypoint": "python hi.py", "integration": "script"},
        "resources": {"nodes": 1, "gpus_per_node": 0, "cpus_per_node": 1, "memory_per_node": 64 * MIB},
    }
    preview = service.create_preview(cluster.db, user_id, spec)
    receipt = service.confirm(cluster.db, user_id, preview["id"], preview["digest"], str(uuid.uuid4()))
    return int(receipt["job_id"])


def test_receiver_gets_one_signed_event_per_state_change_of_its_teams_job_only(cluster: Cluster) -> None:
    receiver = Receiver([500])  # the first request fails: that event must come again
    try:
        cluster.db.fetch_all("UPDATE webhook_settings SET backoff_base = %s RETURNING 1",
                             (timedelta(milliseconds=200),))  # fmt: skip
        alice = cluster.user_id
        bob = add_user(cluster.db, "bob")
        cluster.db.call("create_team_webhook", alice, "alice", receiver.url, SECRET, None)
        cluster.start_agent("a")
        cluster.start_worker()
        mine, theirs = _submit_as(cluster, alice), _submit_as(cluster, bob)
        for job_id in (mine, theirs):
            job = cluster.wait_job(job_id, ("succeeded", "failed", "cancelled"), timeout=90)
            assert job["state"] == "succeeded", cluster.diagnose(job_id)

        changes = [
            "job." + e["to_state"]
            for e in cluster.db.fetch_all(
                """SELECT to_state FROM job_events WHERE job_id = %s AND from_state IS NOT NULL
                      AND from_state <> to_state ORDER BY id""",
                (mine,),
            )
        ]
        assert changes[-1] == "job.succeeded" and len(changes) >= 3

        def all_delivered() -> dict | None:
            events = {g["body"]["id"]: g["body"] for g in receiver.got}
            return events if len(events) == len(changes) else None

        events = wait_for(all_delivered, timeout=30, what="every event of the job at the receiver")
        # One event per state change, in the order of the changes by their time.
        ordered = sorted(events.values(), key=lambda b: b["at"])
        assert [b["kind"] for b in ordered] == changes
        assert {b["job"]["id"] for b in ordered} == {mine} and {b["team"] for b in ordered} == {"alice"}
        # Every request is signed with the team's secret; the one answered 500 came again, same event id.
        assert all(verify(SECRET, g["headers"][SIGNATURE_HEADER], g["raw"]) for g in receiver.got)
        first = receiver.got[0]["body"]["id"]
        assert [g["body"]["id"] for g in receiver.got].count(first) == 2
        assert len(receiver.got) == len(changes) + 1
        # Never an event of another team's job.
        assert all(g["body"]["job"]["id"] != theirs for g in receiver.got)

        # The sender records a delivery after the receiver's answer reaches it: the last one may still be
        # on its way to the database when the receiver has every event (a bounded poll, not a sleep).
        def all_recorded() -> list | None:
            tries = cluster.db.call("team_event_deliveries_of", alice, "alice", 50)
            return tries if {t["state"] for t in tries} == {"delivered"} else None

        tries = wait_for(all_recorded, timeout=30, what="every delivery recorded as delivered")
        assert sorted(len(t["tries"]) for t in tries) == [1] * (len(changes) - 1) + [2]
    finally:
        receiver.close()
