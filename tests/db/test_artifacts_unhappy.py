"""Artifact delivery's unhappy paths over real HTTP on loopback with real files: what once wedged a
delivery (retried until the agent's deadline) now ends, and never with wrong bytes."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import types
from pathlib import Path

import google_crc32c
import pytest

from tests.artifact_fixtures import api_token, make_member, served_artifacts, write_tree
from tests.conftest import free_port
from tests.db.test_artifacts_cli import cli
from tests.db.test_artifacts_gateway import serve_gateway_routes
from tests.db.test_artifacts_http import user_client
from tuneplane.app.db import Database
from tuneplane.workers.agent.checkpoints import CheckpointWatchers, publish_pending
from tuneplane.workers.agent.delivery import Delivery, plan_deliveries
from tuneplane.workers.agent.member_records import MemberRecord, MemberStore
from tuneplane.workers.agent.prepare import NodeAccess
from tuneplane.workers.artifacts.deliver import deliver_artifact, fail_artifact, node_http, register
from tuneplane.workers.artifacts.manifest import build_manifest
from tuneplane.workers.artifacts.upload import HttpChunkTransport, UploadError, upload_artifact

CHUNK = 4096


@pytest.fixture
def env(db: Database, db_url: str, tmp_path: Path, port: int):
    with served_artifacts(db, db_url, tmp_path, port, CHUNK) as served:
        yield served


def test_an_empty_output_directory_completes_by_object_and_shared_delivery(db: Database, env) -> None:
    # Before: finish answered 500 (a NULL reason) and the artifact stayed uploading until the deadline.
    shared_root = env["tmp"] / "shared"
    setup = make_member(
        db, capabilities={"object_delivery": True, "shared_mounts": True, "shared_path": str(shared_root)}
    )
    empty = env["tmp"] / "empty"
    empty.mkdir()
    with node_http(env["url"], setup.credential) as http:
        by_object = deliver_artifact(http, setup.member["id"], "model", empty)
        by_shared = deliver_artifact(
            http, setup.member["id"], "shared", empty, delivery="shared",
            shared_path=str(shared_root / "jobs" / "model"),
        )  # fmt: skip
    for art in (by_object, by_shared):
        assert art["state"] == "complete", art
        assert art["file_count"] == 0 and "verified 0 files" in art["reason"]


def test_an_assembly_cut_short_by_the_blob_store_is_redone_when_the_upload_finishes(
    db: Database, env
) -> None:
    # Every chunk of every file is recorded, but placing the files in the blob store fails (a file stands
    # where its sha256/ directory belongs: the store unwritable at that moment, as a full disk would be).
    # Before: the agent's next pass found no chunk missing, finish changed nothing, and the artifact stayed
    # uploading for ever.
    setup = make_member(db)
    src = env["tmp"] / "out"
    files = {"a.bin": os.urandom(3 * CHUNK + 5), "b.bin": os.urandom(CHUNK), "c.txt": b"c"}
    manifest = write_tree(src, files)
    blocker = env["blob_dir"] / "sha256"
    with node_http(env["url"], setup.credential) as http:
        art = register(http, setup.member["id"], "model", manifest)
        blocker.parent.mkdir(parents=True, exist_ok=True)
        blocker.write_bytes(b"")
        with pytest.raises(UploadError, match="HTTP 500"):
            upload_artifact(src, manifest, HttpChunkTransport(http, art["id"], retries=0), parallel=1)
        # Upload the rest while the store stays broken: all chunks recorded, no file verified.
        for _ in range(len(files)):
            try:
                upload_artifact(src, manifest, HttpChunkTransport(http, art["id"], retries=0), parallel=1)
            except UploadError:
                continue
        held = db.fetch_all(
            "SELECT file_index, count(*) AS n FROM artifact_chunks WHERE artifact_id = %s"
            " GROUP BY 1 ORDER BY 1",
            (art["id"],),
        )
        assert [r["n"] for r in held] == [4, 1, 1]
        blocker.unlink()
        result = upload_artifact(src, manifest, HttpChunkTransport(http, art["id"], retries=0))
    assert result.state == "complete" and result.chunks_sent == 0, result
    for data in files.values():
        sha = hashlib.sha256(data).hexdigest()
        assert (env["blob_dir"] / "sha256" / sha[:2] / sha).read_bytes() == data
    assert build_manifest(src).digest == manifest.digest


BAD_NAMES = pytest.mark.parametrize(
    "bad", [b"line\nbreak.txt", b"latin1-\xe9t\xe9.bin"], ids=["control-character", "not-utf8"]
)


def ended_member(root: Path, member_id: int, bad: bytes) -> Path:
    """A member directory as the agent keeps it after an exit 0: output `model` holds one file whose name
    no manifest can describe, next to a good one; its logs are there."""
    directory = root / f"member-{member_id}"
    model = directory / "output" / "model"
    model.mkdir(parents=True)
    (model / "ok.bin").write_bytes(b"ok" * 3000)
    with open(os.path.join(os.fsencode(model), bad), "wb") as handle:
        handle.write(b"bad")
    (directory / "logs").mkdir()
    (directory / "logs" / "stdout.log").write_text("step 1\n")
    (directory / "capsule").mkdir()
    (directory / "capsule" / "spec.json").write_text(
        json.dumps({"outputs": [{"name": "model", "path": "model"}]})
    )
    (directory / "member.json").write_text(json.dumps({"member_id": member_id}))
    return directory


def run_delivery(db_url: str, env: dict, setup, directory: Path, deadline: float) -> MemberRecord:
    """The agent's delivery task for an ended member, through the node gateway's routes (what agents use),
    until it ends; the member's record."""
    store = MemberStore(env["tmp"] / "state")
    record = MemberRecord(setup.member["id"], 1, setup.job_id, 1, 0, state="ended")
    plan_deliveries(record, directory, deadline)
    store.save(record)

    async def deliver(url: str) -> None:
        access = NodeAccess(url, None, lambda: setup.credential)  # type: ignore[arg-type]
        delivery = Delivery(store, record.member_id, directory, lambda: access, lambda _line: None)
        await asyncio.wait_for(delivery.task, 60)

    with serve_gateway_routes(db_url, env["blob_dir"], free_port()) as url:
        asyncio.run(deliver(url))
    return record


def job_artifacts_seen(db: Database, setup) -> dict[str, dict]:
    return {a["name"]: a for a in db.call("job_artifacts", setup.user_id, setup.job_id)}


@BAD_NAMES
def test_an_output_holding_an_undescribable_file_name_fails_naming_it_and_the_logs_still_arrive(
    db: Database, db_url: str, env, bad: bytes
) -> None:
    # Before: the manifest error escaped the delivery task: the output stayed pending for ever (tried again
    # at every reconnect), the user saw nothing, and the member's logs, delivered after it, never were.
    setup = make_member(db)
    directory = ended_member(env["tmp"], setup.member["id"], bad)
    record = run_delivery(db_url, env, setup, directory, 600)
    model, logs = record.deliveries["model"], record.deliveries["logs"]
    assert model["state"] == "failed" and model["tries"] == 1, model
    named = repr(bad)[2:-1] in model["error"] or repr(bad.decode("latin-1"))[1:-1] in model["error"]
    assert named and "model cannot be delivered" in model["error"]
    assert logs["state"] == "complete", logs
    # The user sees the output failed with the reason among the job's artifacts.
    seen = job_artifacts_seen(db, setup)
    assert seen["model"]["state"] == "failed" and seen["model"]["reason"] == model["error"]
    assert seen["model"]["file_count"] == 0 and seen["logs"]["state"] == "complete"


def test_an_output_never_registered_by_its_deadline_is_recorded_failed_on_the_server(
    db: Database, db_url: str, env
) -> None:
    # Before: only the agent's own record and log said so; the user found no artifact at all.
    setup = make_member(db)
    directory = ended_member(env["tmp"], setup.member["id"], b"fine.txt")
    record = run_delivery(db_url, env, setup, directory, 0)
    assert record.deliveries["model"]["state"] == "failed"
    seen = job_artifacts_seen(db, setup)
    assert seen["model"]["state"] == "failed" and "gave up at its deadline" in seen["model"]["reason"]


@BAD_NAMES
def test_a_checkpoint_holding_an_undescribable_file_name_is_refused_and_the_next_one_published(
    db: Database, env, bad: bytes
) -> None:
    # Before: a name not valid UTF-8 raised out of every scan, so this checkpoint and every later one
    # waited for ever.
    setup = make_member(db)
    directory = ended_member(env["tmp"], setup.member["id"], bad)
    (directory / "output" / "good").mkdir()
    (directory / "output" / "good" / "w.bin").write_bytes(b"w" * 5000)
    requests = directory / "output" / ".tuneplane" / "checkpoints" / "requests"
    requests.mkdir(parents=True)
    (requests / "1.json").write_text(json.dumps({"path": "model", "name": "ckpt"}))
    (requests / "2.json").write_text(json.dumps({"path": "good", "name": "ckpt"}))
    access = NodeAccess(env["url"], None, lambda: setup.credential)  # type: ignore[arg-type]
    assert publish_pending(access, directory, lambda _line: None) == 2
    results = directory / "output" / ".tuneplane" / "checkpoints" / "results"
    first = json.loads((results / "1.json").read_text())
    second = json.loads((results / "2.json").read_text())
    assert first["state"] == "failed" and "not a readable checkpoint" in first["reason"], first
    assert second["state"] == "complete" and second["artifact"] == "ckpt.2", second


def test_only_a_complete_artifact_can_be_verified_and_nothing_is_recorded_otherwise(
    db: Database, env
) -> None:
    # Before: verifying an uploading, failed or pruned artifact recorded a failed verification naming
    # every file "missing", as if stored bytes had been lost.
    db.fetch_one("UPDATE artifact_settings SET keep_checkpoints = 1 RETURNING 1")
    setup = make_member(db)
    src = env["tmp"] / "src"
    manifest = write_tree(src, {"a.bin": b"a" * 100})
    with node_http(env["url"], setup.credential) as http:
        uploading = register(http, setup.member["id"], "partial", manifest)
        failed = register(http, setup.member["id"], "broken", manifest)
        fail_artifact(http, failed["id"], "gave up at the deadline")
        first = deliver_artifact(http, setup.member["id"], "ckpt.1", src, kind="checkpoint")
        (src / "a.bin").write_bytes(b"b" * 100)
        second = deliver_artifact(http, setup.member["id"], "ckpt.2", src, kind="checkpoint")
    assert second["state"] == "complete"
    with user_client(db, env["url"], setup.user_id) as client:
        for art, state, why in (
            (uploading, "uploading", ""),
            (failed, "failed", "gave up at the deadline"),
            (first, "pruned", "pruned by retention"),
        ):
            response = client.post(f"/artifacts/{art['id']}/verify")
            assert response.status_code == 409, response.text
            assert f"is {state}: {why}" in response.json()["error"] and "state" in response.json()["fields"]
        assert client.post(f"/artifacts/{second['id']}/verify").json()["ok"]
        page = client.get(f"/jobs/{setup.job_id}/artifacts", headers={"Accept": "text/html"}).text
    assert db.fetch_all("SELECT artifact_id, ok FROM artifact_verifications") == [
        {"artifact_id": second["id"], "ok": True}
    ]
    # The console offers Verify for the complete artifact only.
    assert page.count("/verify") == 1 and f"/artifacts/{second['id']}/verify" in page


def test_a_download_into_a_directory_holding_other_things_names_each_conflict_and_leaves_no_partials(
    db: Database, env
) -> None:
    # Before: the first conflict ended the command with one OSError line, the other conflicts unnamed and
    # their verified copies left behind in DEST/.tuneplane-partial.
    setup = make_member(db)
    files = {"model/w.bin": os.urandom(9000), "tokenizer.json": b"{}", "readme.txt": b"hi"}
    src = env["tmp"] / "src"
    write_tree(src, files)
    with node_http(env["url"], setup.credential) as http:
        assert deliver_artifact(http, setup.member["id"], "model", src)["state"] == "complete"
    dest = env["tmp"] / "dest"
    dest.mkdir()
    (dest / "model").write_bytes(b"a file where the directory belongs")
    (dest / "tokenizer.json").mkdir()
    (dest / "stale.bin").write_bytes(b"from an earlier download")
    got = cli(env, api_token(db, setup.user_id), "download", str(setup.job_id), "model", str(dest))
    assert got.returncode == 1, got.stdout
    assert "2 file(s) not downloaded" in got.stderr
    assert "model/w.bin: cannot be placed" in got.stderr and "tokenizer.json: cannot be placed" in got.stderr
    assert (dest / "readme.txt").read_bytes() == b"hi"
    assert not (dest / ".tuneplane-partial").exists()
    assert (dest / "stale.bin").exists()  # what the artifact does not name is left alone


def test_a_file_that_vanishes_mid_upload_leaves_the_artifact_to_the_next_try_which_completes(
    db: Database, env
) -> None:
    # Before: the FileNotFoundError escaped deliver_artifact; the agent recorded the output failed for good
    # (a refusal) while the registered artifact stayed uploading on the server for ever.
    setup = make_member(db)
    src = env["tmp"] / "out"
    write_tree(src, {"big.bin": os.urandom(5 * CHUNK), "keep.txt": b"keep"})

    def vanish(path: str, index: int, _size: int) -> None:
        if path == "big.bin" and index == 0:
            (src / "big.bin").unlink()  # before its own thread reads chunk 1

    with node_http(env["url"], setup.credential) as http:
        first = deliver_artifact(http, setup.member["id"], "model", src, on_chunk=vanish, inline_max_bytes=0)
        assert first["state"] == "uploading" and "big.bin" in first["reason"], first
        again = deliver_artifact(http, setup.member["id"], "model", src)
    assert again["id"] == first["id"] and again["state"] == "complete", again
    assert [
        f["path"]
        for f in db.fetch_all("SELECT path FROM artifact_files WHERE artifact_id = %s", (again["id"],))
    ] == ["keep.txt"]


def test_a_checkpoint_whose_upload_meets_a_server_failure_is_published_at_a_later_scan(
    db: Database, env
) -> None:
    # The server cannot stage chunks for a while (a file stands where its staging directory belongs: 500
    # for every chunk). Before: the checkpoint was failed for good the moment the upload gave up.
    setup = make_member(db)
    directory = ended_member(env["tmp"], setup.member["id"], b"fine.txt")
    requests = directory / "output" / ".tuneplane" / "checkpoints" / "requests"
    requests.mkdir(parents=True)
    (requests / "1.json").write_text(json.dumps({"path": "model", "name": "ckpt"}))
    access = NodeAccess(env["url"], None, lambda: setup.credential)  # type: ignore[arg-type]
    blocker = env["blob_dir"] / "staging"
    blocker.parent.mkdir(parents=True, exist_ok=True)
    blocker.write_bytes(b"")
    lines: list[str] = []
    assert publish_pending(access, directory, lines.append) == 0
    assert any("ckpt.1 not yet published" in line and "HTTP 500" in line for line in lines), lines
    results = directory / "output" / ".tuneplane" / "checkpoints" / "results"
    assert not (results / "1.json").exists()
    blocker.unlink()
    assert publish_pending(access, directory, lines.append) == 1
    result = json.loads((results / "1.json").read_text())
    assert result["state"] == "complete" and result["artifact"] == "ckpt.1", result


def test_a_refusal_names_the_bad_field_and_never_touches_a_complete_artifact(db: Database, env) -> None:
    setup = make_member(db)
    src = env["tmp"] / "src"
    write_tree(src, {"a.bin": b"a"})
    mid = setup.member["id"]
    with node_http(env["url"], setup.credential) as http:
        done = deliver_artifact(http, mid, "model", src)
        for body, field in (
            ({"member_id": "1", "name": "x", "reason": "r"}, "member_id"),
            ({"member_id": 2**64, "name": "x", "reason": "r"}, "member_id"),
            ({"member_id": mid, "name": "x", "reason": ""}, "reason"),
            ({"member_id": mid, "name": "bad name", "reason": "r"}, "name"),
            ({"member_id": mid, "name": "x", "kind": "weights", "reason": "r"}, "kind"),
        ):
            response = http.post("/api/artifacts/refused", json=body)
            assert response.status_code == 400 and field in response.json()["fields"], response.text
        response = http.post(
            "/api/artifacts/refused", json={"member_id": mid, "name": "model", "reason": "r"}
        )
        assert response.status_code == 409 and "state" in response.json()["fields"], response.text
    assert db.fetch_one("SELECT state FROM artifacts WHERE id = %s", (done["id"],))["state"] == "complete"
    assert db.fetch_one("SELECT count(*) AS n FROM artifacts")["n"] == 1


@pytest.mark.parametrize("final_retry", [60.0, 0.0], ids=["server-back-in-time", "server-still-failing"])
def test_after_the_member_ended_a_checkpoint_the_server_could_not_take_is_retried_then_failed(
    db: Database, env, final_retry: float
) -> None:
    # The member ends with a checkpoint request pending and the server cannot stage chunks. Before: the
    # watcher's one last scan met the failure and stopped; the checkpoint was never published nor failed.
    setup = make_member(db)
    mid = setup.member["id"]
    work = env["tmp"] / "work"
    (work / "members").mkdir(parents=True)
    directory = ended_member(env["tmp"], mid, b"fine.txt").rename(work / "members" / str(mid))
    requests = directory / "output" / ".tuneplane" / "checkpoints" / "requests"
    requests.mkdir(parents=True)
    (requests / "1.json").write_text(json.dumps({"path": "model", "name": "ckpt"}))
    blocker = env["blob_dir"] / "staging"
    blocker.parent.mkdir(parents=True, exist_ok=True)
    blocker.write_bytes(b"")
    access = NodeAccess(env["url"], None, lambda: setup.credential)  # type: ignore[arg-type]

    def say(line: str) -> None:
        if "not yet published" in line:
            blocker.unlink(missing_ok=True)  # the server recovers after the first failure

    async def member_ends() -> None:
        paths = types.SimpleNamespace(work_dir=work)
        watchers = CheckpointWatchers(paths, lambda: access, say, final_retry=final_retry)
        watchers.start(mid)
        watchers.member_ended(mid)
        await asyncio.wait_for(watchers.tasks[mid][0], 90)

    asyncio.run(member_ends())
    result = json.loads(
        (directory / "output" / ".tuneplane" / "checkpoints" / "results" / "1.json").read_text()
    )
    row = db.fetch_one("SELECT state, reason FROM artifacts WHERE name = 'ckpt.1'")
    if final_retry:
        assert result["state"] == "complete" and row["state"] == "complete", (result, row)
    else:
        assert result["state"] == "failed" and "HTTP 500" in result["reason"], result
        assert row["state"] == "failed" and "upload failed" in row["reason"], row


def test_a_lost_members_uploading_artifacts_fail_and_free_their_bytes(db: Database, env) -> None:
    # The node is fenced while a checkpoint uploads: its member is lost and may no longer deliver. Before:
    # the artifact stayed uploading for ever and its blobs stayed referenced (never collected).
    setup = make_member(db)
    src = env["tmp"] / "src"
    manifest = write_tree(src, {"done.bin": b"d" * 100, "half.bin": os.urandom(3 * CHUNK)})
    with node_http(env["url"], setup.credential) as http:
        art = register(http, setup.member["id"], "ckpt.1", manifest, kind="checkpoint")
        http.put(
            f"/api/artifacts/{art['id']}/files/1/chunks/0",
            content=(src / "half.bin").read_bytes()[:CHUNK],
            headers={"X-Chunk-Crc32c": f"{google_crc32c.value((src / 'half.bin').read_bytes()[:CHUNK]):08x}"},
        ).raise_for_status()
        assert upload_status(http, art["id"])["state"] == "uploading"
        node = db.fetch_one("SELECT name FROM nodes WHERE id = %s", (setup.node_id,))["name"]
        db.call("fence_node", node, "disk died")
        refused = http.post(f"/api/artifacts/{art['id']}/finish")
    assert refused.status_code == 409
    row = db.fetch_one("SELECT state, reason FROM artifacts WHERE id = %s", (art["id"],))
    assert row["state"] == "failed" and "was lost while it was uploading" in row["reason"], row
    assert db.fetch_one("SELECT count(*) AS n FROM artifact_chunks")["n"] == 0
    assert db.fetch_all("SELECT * FROM blob_references() WHERE why LIKE 'artifact%'") == []


def upload_status(http, artifact_id: int) -> dict:
    return http.get(f"/api/artifacts/{artifact_id}/upload").json()
