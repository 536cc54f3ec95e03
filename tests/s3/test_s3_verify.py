"""`tuneplane artifacts verify` (POST /artifacts/<id>/verify) of an S3 fleet's artifact re-checks the objects
in the store (issue 32): the server streams each one once and hashes it against the manifest; a byte
flipped in the store fails the verification and marks the checkpoint corrupt (never resumed from); the
server's own blob directory is never read."""

from __future__ import annotations

import json
import secrets
from pathlib import Path

import pytest
from psycopg.types.json import Jsonb

from tests.artifact_fixtures import api_token, make_member
from tests.console_server import cli_invoker, serving_console
from tests.s3.test_s3_delivery import _deliver, _register, delivery  # noqa: F401 - its fixture
from tests.seaweed_store import ACCESS_KEY, SECRET_KEY, object_keys
from tuneplane.app import db_functions as fn
from tuneplane.app.artifacts.s3_delivery import S3Delivery
from tuneplane.app.db import Database
from tuneplane.app.web import create_app


def _complete_in_fleet_store(
    db: Database,
    delivery: S3Delivery,  # noqa: F811 - the fixture imported above
    tmp_path: Path,
    files: dict[str, bytes],
) -> tuple:
    """A member whose fleet's store is `delivery`'s, and its artifact of `files` delivered there, complete."""
    setup = make_member(db)
    loc = delivery.store.location
    fleet = db.fetch_one("SELECT name FROM tuneplane.fleets WHERE id = %s", (setup.fleet_id,))["name"]
    storage = {"kind": "s3", "bucket": loc.bucket, "prefix": loc.prefix, "endpoint": loc.endpoint}
    db.call(fn.set_fleet_storage, fleet, Jsonb(storage), None)
    art, manifest = _register(db, setup, tmp_path / "out", files)
    assert _deliver(delivery, setup.credential_hash, art, tmp_path / "out", manifest)["state"] == "complete"
    return setup, art


def test_verify_reads_the_fleet_store_and_a_flipped_byte_marks_it_corrupt(
    db: Database,
    db_url: str,
    delivery: S3Delivery,  # noqa: F811 - the fixture imported above
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    data = secrets.token_bytes(40_000)
    setup, art = _complete_in_fleet_store(db, delivery, tmp_path, {"w.bin": data, "cfg.json": b"{}"})

    blob_dir = tmp_path / "server-blobs"
    app = create_app(db_url)
    app.config["TP_BLOB_DIR"] = str(blob_dir)
    client = app.test_client()
    headers = {"Authorization": f"Bearer {api_token(db, setup.user_id)}", "Accept": "application/json"}
    for name in (
        "TUNEPLANE_S3_ACCESS_KEY_ID",
        "TUNEPLANE_S3_SECRET_ACCESS_KEY",
        "TUNEPLANE_S3_CREDENTIALS_FILE",
    ):
        monkeypatch.delenv(name, raising=False)
    refused = client.post(f"/artifacts/{art['id']}/verify", headers=headers)
    assert refused.status_code == 503 and "credentials" in refused.get_json()["error"]

    monkeypatch.setenv("TUNEPLANE_S3_ACCESS_KEY_ID", ACCESS_KEY)
    monkeypatch.setenv("TUNEPLANE_S3_SECRET_ACCESS_KEY", SECRET_KEY)
    ok = client.post(f"/artifacts/{art['id']}/verify", headers=headers)
    assert ok.status_code == 200, ok.get_data(as_text=True)
    assert ok.get_json()["ok"] is True and ok.get_json()["checked"] == 2
    assert not blob_dir.exists() or not any(blob_dir.rglob("*"))  # nothing read from (or put on) its disk

    flipped = bytearray(data)
    flipped[1234] ^= 0x01
    store = delivery.store
    keys = object_keys(db, store, art["id"])
    store.put_bytes(keys["w.bin"], bytes(flipped))  # damaged at rest, where the server verified it
    bad = client.post(f"/artifacts/{art['id']}/verify", headers=headers).get_json()
    assert bad["ok"] is False and "w.bin" in str(bad)
    assert db.fetch_one("SELECT tuneplane.artifact_is_corrupt(%s) AS c", (art["id"],))["c"] is True

    store.delete(keys["cfg.json"])  # and a missing object is named
    gone = client.post(f"/artifacts/{art['id']}/verify", headers=headers).get_json()
    assert gone["ok"] is False and "cfg.json" in str(gone)


def test_the_cli_says_it_verified_the_fleets_store(
    db: Database,
    db_url: str,
    delivery: S3Delivery,  # noqa: F811 - the fixture imported above
    tmp_path: Path,
    port: int,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`tuneplane artifacts verify` of an S3 fleet's artifact once said "files in the server's stored files"
    (walking issue 32 as an operator): it names the store it re-read, and the JSON carries its location."""
    setup, art = _complete_in_fleet_store(db, delivery, tmp_path, {"w.bin": b"weights", "cfg.json": b"{}"})
    loc = delivery.store.location
    monkeypatch.setenv("TUNEPLANE_S3_ACCESS_KEY_ID", ACCESS_KEY)
    monkeypatch.setenv("TUNEPLANE_S3_SECRET_ACCESS_KEY", SECRET_KEY)
    with serving_console(db_url, tmp_path, port) as url:
        run = cli_invoker(monkeypatch, tmp_path, url, {"alice": api_token(db, setup.user_id)})
        job = str(art["job_id"])
        said = run("artifacts", "verify", job, art["name"])
        assert said.exit_code == 0, said.output
        assert f"2 files in the fleet's store s3://{loc.bucket}/{loc.prefix}".rstrip("/") in said.output
        assert f"at {loc.endpoint}" in said.output
        as_json = json.loads(run("artifacts", "verify", job, art["name"], "--json").output)
    assert as_json["ok"] is True and as_json["storage"]["bucket"] == loc.bucket
    assert "secret" not in json.dumps(as_json).lower()


def test_a_store_that_does_not_answer_is_a_503_and_marks_nothing(
    db: Database,
    db_url: str,
    delivery: S3Delivery,  # noqa: F811 - the fixture imported above
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Walking issue 32: with the store down, download and verify answered 500; with keys it refuses
    (or a 5xx), verify recorded the files "unreadable" and so marked a good checkpoint corrupt — never
    resumed from again. A store that does not answer proves nothing: 503 naming it, nothing recorded."""
    from tests.conftest import free_port

    setup, art = _complete_in_fleet_store(db, delivery, tmp_path, {"w.bin": b"weights" * 100})
    loc = delivery.store.location
    client = create_app(db_url).test_client()
    headers = {"Authorization": f"Bearer {api_token(db, setup.user_id)}", "Accept": "application/json"}

    def refused_and_unmarked(what: str) -> None:
        for response in (
            client.post(f"/artifacts/{art['id']}/verify", headers=headers),
            client.get(f"/artifacts/{art['id']}/files/0", headers=headers),
        ):
            assert response.status_code == 503, (what, response.get_data(as_text=True))
            said = response.get_json()["error"]
            assert f"the object store s3://{loc.bucket}/{loc.prefix}" in said and "nothing was marked" in said
        assert db.fetch_one("SELECT tuneplane.artifact_is_corrupt(%s) AS c", (art["id"],))["c"] is False
        assert db.fetch_all("SELECT 1 FROM tuneplane.artifact_verifications WHERE artifact_id = %s",
                            (art["id"],)) == []  # fmt: skip

    monkeypatch.setenv("TUNEPLANE_S3_ACCESS_KEY_ID", ACCESS_KEY)
    monkeypatch.setenv("TUNEPLANE_S3_SECRET_ACCESS_KEY", "not-the-stores-secret")
    refused_and_unmarked("keys the store refuses (403)")
    # The endpoint gone (nothing listens there): as a store that is down.
    dead = f"http://127.0.0.1:{free_port()}"
    db.fetch_one(
        "UPDATE tuneplane.fleets SET storage = storage || jsonb_build_object('endpoint', %s::text) "
        "WHERE id = %s RETURNING id",
        (dead, setup.fleet_id),
    )
    refused_and_unmarked("store down")
