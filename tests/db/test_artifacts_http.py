"""Artifact delivery and retrieval over real HTTP on loopback (waitress in a thread, real files)."""

from __future__ import annotations

import base64
import hashlib
import os
from pathlib import Path

import google_crc32c
import httpx
import pytest

from tests.artifact_fixtures import api_token, make_member, served_artifacts, write_tree
from tests.launch_fixtures import make_user
from tuneplane.app.db import Database
from tuneplane.workers.artifacts.deliver import deliver_artifact, node_http, register
from tuneplane.workers.artifacts.manifest import build_manifest
from tuneplane.workers.artifacts.upload import (
    INLINE_MAX_BYTES,
    HttpChunkTransport,
    UploadError,
    upload_artifact,
)

CHUNK = 4096


@pytest.fixture
def env(db: Database, db_url: str, tmp_path: Path, port: int):
    with served_artifacts(db, db_url, tmp_path, port, CHUNK) as served:
        yield served


def files_of_all_shapes() -> dict[str, bytes]:
    return {
        "model/weights.bin": os.urandom(5 * CHUNK + 123),
        "model/exact.bin": os.urandom(2 * CHUNK),
        "config.json": b'{"lr": 0.001}',
        "empty.txt": b"",
    }


def user_client(db: Database, url: str, user_id: int) -> httpx.Client:
    return httpx.Client(
        base_url=url,
        headers={"Authorization": f"Bearer {api_token(db, user_id)}", "Accept": "application/json"},
    )


def test_object_upload_completes_and_every_file_downloads_verified(db: Database, env) -> None:
    setup = make_member(db)
    src = env["tmp"] / "out"
    files = files_of_all_shapes()
    manifest = write_tree(src, files)
    with node_http(env["url"], setup.credential) as http:
        result = deliver_artifact(http, setup.member["id"], "model", src, inline_max_bytes=0)
    assert result["state"] == "complete", result
    assert result["chunks_sent"] == 6 + 2 + 1  # the empty file needs no chunk
    with user_client(db, env["url"], setup.user_id) as client:
        listed = client.get(f"/jobs/{setup.job_id}/artifacts").json()["artifacts"]
        assert [(a["name"], a["state"], a["manifest_digest"]) for a in listed] == [
            ("model", "complete", manifest.digest)
        ]
        detail = client.get(f"/jobs/{setup.job_id}/artifacts/model").json()
        for entry in detail["files"]:
            body = client.get(f"/artifacts/{detail['id']}/files/{entry['file_index']}").content
            assert body == files[entry["path"]]
        report = client.post(f"/artifacts/{detail['id']}/verify").json()
        assert report["ok"] and report["checked"] == 4
    # Staging is gone once complete; the blobs are content-addressed.
    assert not (env["blob_dir"] / "staging" / "artifacts" / str(detail["id"])).exists()
    sha = hashlib.sha256(files["model/weights.bin"]).hexdigest()
    assert (env["blob_dir"] / "sha256" / sha[:2] / sha).read_bytes() == files["model/weights.bin"]


def test_a_small_artifact_travels_inside_its_registration(db: Database, env) -> None:
    # Issue 23: a gang's members all deliver their logs (and small outputs) as they end; each artifact was
    # a registration, a status, a chunk per file and a finish. Now one request, and verified all the same.
    setup = make_member(db)
    src = env["tmp"] / "out"
    files = files_of_all_shapes()
    manifest = write_tree(src, files)
    requests: list[tuple[str, str]] = []
    with node_http(env["url"], setup.credential) as http:
        http.event_hooks["request"].append(lambda r: requests.append((r.method, r.url.path)))
        result = deliver_artifact(http, setup.member["id"], "model", src)
    assert result["state"] == "complete", result
    assert requests == [("POST", "/api/artifacts")]
    with user_client(db, env["url"], setup.user_id) as client:
        detail = client.get(f"/jobs/{setup.job_id}/artifacts/model").json()
        assert detail["manifest_digest"] == manifest.digest
        for entry in detail["files"]:
            body = client.get(f"/artifacts/{detail['id']}/files/{entry['file_index']}").content
            assert body == files[entry["path"]]
        report = client.post(f"/artifacts/{detail['id']}/verify").json()
        assert report["ok"] and report["checked"] == 4


def test_inline_bytes_that_do_not_match_the_manifest_are_left_to_the_chunk_upload(db: Database, env) -> None:
    setup = make_member(db)
    src = env["tmp"] / "out"
    files = {"a.bin": os.urandom(3 * CHUNK), "b.txt": b"right"}
    manifest = write_tree(src, files)
    sent = {"a.bin": files["a.bin"], "b.txt": b"wrong"}
    inline = {path: base64.b64encode(data).decode() for path, data in sent.items()}
    with node_http(env["url"], setup.credential) as http:
        art = register(http, setup.member["id"], "model", manifest, inline=inline)
        assert art["state"] == "uploading", art
        verified = db.fetch_all(
            "SELECT path FROM artifact_files WHERE artifact_id = %s AND verified_at IS NOT NULL", (art["id"],)
        )
        assert [row["path"] for row in verified] == ["a.bin"]
        result = upload_artifact(src, manifest, HttpChunkTransport(http, art["id"]))
    assert result.state == "complete" and result.chunks_sent == 1 and result.files_already_verified == 1
    wrong = hashlib.sha256(b"wrong").hexdigest()
    assert not (env["blob_dir"] / "sha256" / wrong[:2] / wrong).exists()


def test_inline_files_the_server_cannot_take_are_refused_naming_inline(db: Database, env) -> None:
    setup = make_member(db)
    src = env["tmp"] / "out"
    manifest = write_tree(src, {"a.txt": b"a"})
    a = base64.b64encode(b"a").decode()
    huge = base64.b64encode(b"x" * (INLINE_MAX_BYTES + 1)).decode()
    cases = [
        ({"elsewhere.txt": a}, {}, 400, "not a file of the manifest"),
        ({"a.txt": "not base64!"}, {}, 400, "not base64"),
        (["a.txt"], {}, 400, "inline must be an object"),
        ({"a.txt": huge}, {}, 413, "more than"),
        ({"a.txt": a}, {"delivery": "shared", "shared_path": "/srv/x"}, 400, "object delivery only"),
    ]
    headers = {"Authorization": f"Node {setup.credential}"}
    for inline, extra, status, words in cases:
        body = {
            "member_id": setup.member["id"], "name": "model", "manifest": manifest.as_json(),
            "manifest_digest": manifest.digest, "inline": inline, **extra,
        }  # fmt: skip
        answer = httpx.post(env["url"] + "/api/artifacts", json=body, headers=headers, timeout=30)
        assert answer.status_code == status and words in answer.json()["error"], (inline, answer.text)
        assert "inline" in answer.json()["fields"], answer.json()
    assert db.fetch_all("SELECT id FROM artifacts WHERE member_id = %s", (setup.member["id"],)) == []


def test_tampered_and_deleted_blobs_are_named_by_verify_and_downloads_are_cut(db: Database, env) -> None:
    setup = make_member(db)
    src = env["tmp"] / "out"
    files = files_of_all_shapes()
    write_tree(src, files)
    with node_http(env["url"], setup.credential) as http:
        art = deliver_artifact(http, setup.member["id"], "model", src)

    def blob(data: bytes) -> Path:
        sha = hashlib.sha256(data).hexdigest()
        return env["blob_dir"] / "sha256" / sha[:2] / sha

    weights = blob(files["model/weights.bin"])
    damaged = bytearray(weights.read_bytes())
    damaged[7777] ^= 0x40
    weights.write_bytes(bytes(damaged))
    blob(files["config.json"]).unlink()
    with user_client(db, env["url"], setup.user_id) as client:
        report = client.post(f"/artifacts/{art['id']}/verify").json()
        assert not report["ok"]
        assert [m["path"] for m in report["mismatched"]] == ["model/weights.bin"]
        assert report["missing"] == ["config.json"]
        listed = client.get(f"/jobs/{setup.job_id}/artifacts").json()["artifacts"][0]
        assert listed["state"] == "complete" and listed["last_verify_ok"] is False
        files_list = client.get(f"/artifacts/{art['id']}").json()["files"]
        index = {f["path"]: f["file_index"] for f in files_list}
        damaged_download = client.get(f"/artifacts/{art['id']}/files/{index['model/weights.bin']}")
        assert damaged_download.status_code == 409 and "model/weights.bin" in damaged_download.json()["error"]
        missing = client.get(f"/artifacts/{art['id']}/files/{index['config.json']}")
        assert missing.status_code == 410 and "config.json" in missing.json()["error"]


def test_a_chunk_whose_bytes_do_not_match_its_sha256_is_refused(db: Database, env) -> None:
    setup = make_member(db)
    src = env["tmp"] / "out"
    manifest = write_tree(src, {"a.bin": os.urandom(100)})
    with node_http(env["url"], setup.credential) as http:
        from tuneplane.workers.artifacts.deliver import register

        art = register(http, setup.member["id"], "a", manifest)
        response = http.put(
            f"/api/artifacts/{art['id']}/files/0/chunks/0",
            content=b"x" * 100,
            headers={"X-Chunk-Sha256": manifest.files[0].sha256},
        )
        assert response.status_code == 422 and "send it again" in response.json()["error"]
        status = http.get(f"/api/artifacts/{art['id']}/upload").json()
    assert status["files"][0]["chunks"] == [] and status["state"] == "uploading"


class StopAfter:
    """An uploader that loses its connection after n chunks (the transport raises, as a dead link would)."""

    def __init__(self, inner: HttpChunkTransport, n: int) -> None:
        self.inner, self.n = inner, n

    def status(self):
        return self.inner.status()

    def put_chunk(self, *args):
        if self.n == 0:
            raise UploadError("connection lost")
        self.n -= 1
        return self.inner.put_chunk(*args)

    def finish(self):
        return self.inner.finish()


def test_an_interrupted_upload_resumes_with_only_the_missing_chunks(db: Database, env) -> None:
    setup = make_member(db)
    src = env["tmp"] / "out"
    files = files_of_all_shapes()
    manifest = write_tree(src, files)
    with node_http(env["url"], setup.credential) as http:
        from tuneplane.workers.artifacts.deliver import register

        art = register(http, setup.member["id"], "model", manifest)
        with pytest.raises(UploadError, match="connection lost"):
            upload_artifact(src, manifest, StopAfter(HttpChunkTransport(http, art["id"]), 4), parallel=1)
        assert db.fetch_one("SELECT state FROM artifacts WHERE id = %s", (art["id"],))["state"] == "uploading"
        result = deliver_artifact(http, setup.member["id"], "model", src, inline_max_bytes=0)
    assert result["id"] == art["id"] and result["state"] == "complete"
    assert result["chunks_sent"] == 9 - 4


def test_bytes_changed_after_the_manifest_never_complete(db: Database, env) -> None:
    setup = make_member(db)
    src = env["tmp"] / "out"
    manifest = write_tree(src, {"a.bin": os.urandom(3 * CHUNK)})
    data = bytearray((src / "a.bin").read_bytes())
    data[5000] ^= 1
    (src / "a.bin").write_bytes(bytes(data))
    with node_http(env["url"], setup.credential) as http:
        from tuneplane.workers.artifacts.deliver import register

        art = register(http, setup.member["id"], "a", manifest)
        with pytest.raises(UploadError, match="do not match the manifest"):
            upload_artifact(src, manifest, HttpChunkTransport(http, art["id"]))
    row = db.fetch_one("SELECT state, reason FROM artifacts WHERE id = %s", (art["id"],))
    assert row["state"] == "uploading" and "all its chunks were dropped" in row["reason"]
    assert (
        db.fetch_one("SELECT count(*) AS n FROM artifact_chunks WHERE artifact_id = %s", (art["id"],))["n"]
        == 0
    )


def test_a_staged_chunk_damaged_on_the_server_is_sent_again(db: Database, env) -> None:
    setup = make_member(db)
    src = env["tmp"] / "out"
    files = {"a.bin": os.urandom(3 * CHUNK)}
    manifest = write_tree(src, files)
    with node_http(env["url"], setup.credential) as http:
        from tuneplane.workers.artifacts.deliver import register

        art = register(http, setup.member["id"], "a", manifest)
        transport = HttpChunkTransport(http, art["id"])
        with pytest.raises(UploadError):
            upload_artifact(src, manifest, StopAfter(transport, 2), parallel=1)
        staged = next((env["blob_dir"] / "staging" / "artifacts" / str(art["id"])).rglob("*.part"))
        with open(staged, "r+b") as handle:
            handle.seek(10)
            handle.write(b"\xff\xfe")
        with pytest.raises(UploadError, match=r"chunks \[0\] must be sent again"):
            upload_artifact(src, manifest, transport)
        result = upload_artifact(src, manifest, transport)
    assert result.state == "complete" and result.chunks_sent == 1


def test_shared_mount_delivery_is_verified_on_the_shared_path(db: Database, env) -> None:
    shared_root = env["tmp"] / "shared"
    setup = make_member(
        db, capabilities={"object_delivery": False, "shared_mounts": True, "shared_path": str(shared_root)}
    )
    src = env["tmp"] / "out"
    files = files_of_all_shapes()
    write_tree(src, files)
    place = shared_root / "jobs" / str(setup.job_id) / "model"
    with node_http(env["url"], setup.credential) as http:
        art = deliver_artifact(
            http, setup.member["id"], "model", src, delivery="shared", shared_path=str(place)
        )
    assert art["state"] == "complete" and art["shared_path"] == str(place)
    assert (place / "model" / "weights.bin").read_bytes() == files["model/weights.bin"]
    (place / "config.json").write_bytes(b'{"lr": 0.002}')
    (place / "empty.txt").unlink()
    with user_client(db, env["url"], setup.user_id) as client:
        report = client.post(f"/artifacts/{art['id']}/verify").json()
    assert [m["path"] for m in report["mismatched"]] == ["config.json"] and report["missing"] == ["empty.txt"]


def test_shared_files_that_do_not_match_fail_the_artifact_with_the_reason(db: Database, env) -> None:
    shared_root = env["tmp"] / "shared"
    setup = make_member(db, capabilities={"shared_mounts": True, "shared_path": str(shared_root)})
    place = shared_root / "m"
    manifest = write_tree(place, {"a.bin": b"abc", "b.bin": b"def"})
    (place / "b.bin").write_bytes(b"DEF")
    with node_http(env["url"], setup.credential) as http:
        from tuneplane.workers.artifacts.deliver import register

        art = register(http, setup.member["id"], "m", manifest, delivery="shared", shared_path=str(place))
    assert art["state"] == "failed" and "mismatch: b.bin" in art["reason"]


def test_other_users_cannot_see_or_download_artifacts(db: Database, env) -> None:
    setup = make_member(db)
    src = env["tmp"] / "out"
    write_tree(src, {"a.bin": b"secret"})
    with node_http(env["url"], setup.credential) as http:
        art = deliver_artifact(http, setup.member["id"], "a", src)
    mallory = make_user(db, "mallory")
    with user_client(db, env["url"], mallory) as client:
        assert client.get(f"/jobs/{setup.job_id}/artifacts").status_code == 404
        assert client.get(f"/artifacts/{art['id']}/files/0").status_code == 404
        assert client.post(f"/artifacts/{art['id']}/verify").status_code == 404
    anonymous = httpx.get(
        f"{env['url']}/artifacts/{art['id']}/files/0", headers={"Accept": "application/json"}
    )
    assert anonymous.status_code == 401
    assert build_manifest(src).digest == art["manifest_digest"]


def test_the_console_lists_artifacts_with_a_verify_button_and_the_job_page_loads_them(
    db: Database, env
) -> None:
    setup = make_member(db)
    src = env["tmp"] / "out"
    manifest = write_tree(src, {"a.bin": b"abc"})
    with node_http(env["url"], setup.credential) as http:
        art = deliver_artifact(http, setup.member["id"], "model", src)
    token = api_token(db, setup.user_id)
    html = httpx.get(
        f"{env['url']}/jobs/{setup.job_id}/artifacts",
        headers={"Authorization": f"Bearer {token}", "Accept": "text/html"},
    )
    assert html.status_code == 200
    assert "model" in html.text and manifest.digest[:16] in html.text and ">Verify</button>" in html.text
    assert f"/artifacts/{art['id']}/verify" in html.text
    result = httpx.post(
        f"{env['url']}/artifacts/{art['id']}/verify",
        headers={"Authorization": f"Bearer {token}", "Accept": "text/html"},
    )
    assert result.status_code == 200 and "1 files recomputed" in result.text
    page = httpx.get(f"{env['url']}/artifacts/{art['id']}", headers={"Authorization": f"Bearer {token}"})
    assert page.status_code == 200 and "a.bin" in page.text and manifest.digest in page.text
    job_page = httpx.get(f"{env['url']}/jobs/{setup.job_id}", headers={"Authorization": f"Bearer {token}"})
    assert job_page.status_code == 200 and f"/jobs/{setup.job_id}/artifacts" in job_page.text


def test_a_chunk_is_checked_by_its_crc32c_and_one_without_a_digest_is_refused(db: Database, env) -> None:
    setup = make_member(db)
    src = env["tmp"] / "out"
    manifest = write_tree(src, {"a.bin": os.urandom(100)})
    with node_http(env["url"], setup.credential) as http:
        from tuneplane.workers.artifacts.deliver import register

        art = register(http, setup.member["id"], "a", manifest)
        url = f"/api/artifacts/{art['id']}/files/0/chunks/0"
        good_crc = f"{google_crc32c.value((src / 'a.bin').read_bytes()):08x}"
        damaged = http.put(url, content=b"x" * 100, headers={"X-Chunk-Crc32c": good_crc})
        assert damaged.status_code == 422 and "crc32c" in damaged.json()["error"]
        bare = http.put(url, content=(src / "a.bin").read_bytes())
        assert bare.status_code == 400 and "X-Chunk-Crc32c" in bare.json()["error"]
        assert http.get(f"/api/artifacts/{art['id']}/upload").json()["files"][0]["chunks"] == []
        ok = http.put(url, content=(src / "a.bin").read_bytes(), headers={"X-Chunk-Crc32c": good_crc})
    assert ok.status_code == 200 and ok.json()["state"] == "complete"
    assert db.fetch_one("SELECT state FROM artifacts WHERE id = %s", (art["id"],))["state"] == "complete"


def test_the_job_page_shows_how_far_an_upload_has_come(db: Database, env) -> None:
    setup = make_member(db)
    src = env["tmp"] / "out"
    manifest = write_tree(src, {"a.bin": os.urandom(4 * CHUNK), "b.txt": b"small"})
    with node_http(env["url"], setup.credential) as http:
        from tuneplane.workers.artifacts.deliver import register

        art = register(http, setup.member["id"], "model", manifest)
        with pytest.raises(UploadError):  # two of a.bin's four chunks, then the link drops
            upload_artifact(src, manifest, StopAfter(HttpChunkTransport(http, art["id"]), 2), parallel=1)
    listed = user_client(db, env["url"], setup.user_id).get(f"/jobs/{setup.job_id}/artifacts").json()
    (row,) = listed["artifacts"]
    assert row["state"] == "uploading" and row["uploaded_bytes"] == 2 * CHUNK
    token = api_token(db, setup.user_id)
    html = httpx.get(
        f"{env['url']}/jobs/{setup.job_id}/artifacts",
        headers={"Authorization": f"Bearer {token}", "Accept": "text/html"},
    ).text
    assert f'<progress max="{4 * CHUNK + 5}" value="{2 * CHUNK}">' in html and "50%" in html
