"""Source archives and capsules of an S3 fleet live in its store (issue 32, item 5): `POST /sources?fleet=`
keeps the archive in the fleet's store (a real SeaweedFS), the worker builds the capsule from it there and
writes the capsule there too; the server's blob directory holds neither. An archive whose object changed in
the store never enters a capsule; a worker without the store's credentials aborts the launch saying so."""

from __future__ import annotations

import asyncio
import hashlib
import json
import secrets
from pathlib import Path

import pytest
from psycopg.types.json import Jsonb

from tests.artifact_fixtures import api_token
from tests.db.test_launch_worker import _job_with_spec, _launch, _worker
from tests.db.test_submission_cli import cli, logged_in, server_url  # noqa: F401 - their fixtures
from tests.e2e.launch_cluster import source_archive
from tests.launch_fixtures import job, make_fleet, make_node, make_user
from tests.seaweed_store import ACCESS_KEY, BUCKET, SECRET_KEY
from tests.unit.test_capsule_and_runner import SCRIPT, _spec
from tuneplane.app import db_functions as fn
from tuneplane.app.db import Database
from tuneplane.app.s3store import S3Credentials, S3Location, S3Store
from tuneplane.app.web import create_app
from tuneplane.workers.capsule import unpack_capsule


@pytest.fixture
def s3_setup(db: Database, db_url: str, tmp_path: Path, seaweed, monkeypatch: pytest.MonkeyPatch) -> dict:
    monkeypatch.setenv("TUNEPLANE_S3_ACCESS_KEY_ID", ACCESS_KEY)  # the server's and the worker's
    monkeypatch.setenv("TUNEPLANE_S3_SECRET_ACCESS_KEY", SECRET_KEY)
    user = make_user(db)
    fleet = make_fleet(db)
    make_node(db, fleet, "n0", gpus=2)
    prefix = f"src/{secrets.token_hex(4)}"
    storage = {"kind": "s3", "bucket": BUCKET, "prefix": prefix, "endpoint": seaweed.endpoint}
    db.call(fn.set_fleet_storage, "gpu", Jsonb(storage), None)
    store = S3Store(S3Location(seaweed.endpoint, BUCKET, prefix), S3Credentials(ACCESS_KEY, SECRET_KEY))
    app = create_app(db_url, config={"SECRET_KEY": "t", "TP_DATA_DIR": str(tmp_path / "data")})
    client = app.test_client()
    headers = {"Authorization": f"Bearer {api_token(db, user)}", "Accept": "application/json",
               "Content-Type": "application/gzip"}  # fmt: skip
    data = source_archive({"main.py": SCRIPT})
    answer = client.post("/sources?fleet=gpu", data=data, headers=headers)
    assert answer.status_code == 201, answer.get_data(as_text=True)
    sha = hashlib.sha256(data).hexdigest()
    assert answer.get_json()["archive"].removeprefix("sha256:") == sha
    return {"user": user, "fleet": fleet, "store": store, "sha": sha, "data": data, "tmp": tmp_path,
            "spec": _spec(sha)}  # fmt: skip


def _files_under(root: Path) -> list[Path]:
    return [p for p in root.rglob("*") if p.is_file()] if root.exists() else []


def test_an_s3_fleets_source_archive_and_capsule_live_in_its_store(
    db: Database, db_url: str, s3_setup: dict
) -> None:
    s = s3_setup
    store = s["store"]
    assert store.exists(s["sha"])
    assert _files_under(s["tmp"] / "data" / "blobs") == []  # the server kept no copy
    _job_with_spec(db, s, s["spec"])
    (placed,) = db.call("reserve_next", s["fleet"], 1000)
    # The worker's blob directory is its own (setup's tmp/blobs): only the spec index may land there.
    assert asyncio.run(_launch(_worker(db_url, s), placed["attempt_id"])) == "preparing"
    digest = db.fetch_one("SELECT capsule_digest FROM attempts WHERE id = %s", (placed["attempt_id"],))[
        "capsule_digest"
    ]
    assert store.exists(digest)
    assert _files_under(s["tmp"] / "blobs" / "sha256") == []
    fetched = s["tmp"] / "capsule.tar"
    fetched.write_bytes(store.open(digest).read())
    unpack_capsule(fetched, digest, s["tmp"] / "unpacked")  # verifies the digest
    assert (s["tmp"] / "unpacked" / "source" / "archive.tar.gz").read_bytes() == s["data"]


def test_an_archive_changed_in_the_store_never_enters_a_capsule(
    db: Database, db_url: str, s3_setup: dict
) -> None:
    s = s3_setup
    store = s["store"]
    changed = bytearray(s["data"])
    changed[-1] ^= 0x01
    store.put_bytes(store.blob_key(s["sha"]), bytes(changed))
    job_id = _job_with_spec(db, s, s["spec"])
    (placed,) = db.call("reserve_next", s["fleet"], 1000)
    assert asyncio.run(_launch(_worker(db_url, s), placed["attempt_id"])).startswith("aborted")
    reason = job(db, job_id)["state_reason"]
    assert "capsule could not be built" in reason and f"the job pinned {s['sha']}" in reason, reason


def test_a_worker_without_the_stores_credentials_aborts_the_launch_saying_so(
    db: Database, db_url: str, s3_setup: dict, monkeypatch: pytest.MonkeyPatch
) -> None:
    s = s3_setup
    monkeypatch.delenv("TUNEPLANE_S3_ACCESS_KEY_ID")
    job_id = _job_with_spec(db, s, json.loads(json.dumps(s["spec"])))
    (placed,) = db.call("reserve_next", s["fleet"], 1000)
    assert asyncio.run(_launch(_worker(db_url, s), placed["attempt_id"])).startswith("aborted")
    reason = job(db, job_id)["state_reason"]
    assert "the fleet's object store" in reason and "credentials" in reason, reason


def test_the_cli_uploads_an_s3_fleets_source_into_its_store_and_the_preview_reads_it_there(
    db: Database,
    seaweed,
    cli,  # noqa: F811 - the fixture imported above
    logged_in: str,  # noqa: F811
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("TUNEPLANE_S3_ACCESS_KEY_ID", ACCESS_KEY)  # the (in-process) server's
    monkeypatch.setenv("TUNEPLANE_S3_SECRET_ACCESS_KEY", SECRET_KEY)
    prefix = f"cli/{secrets.token_hex(4)}"
    storage = {"kind": "s3", "bucket": BUCKET, "prefix": prefix, "endpoint": seaweed.endpoint}
    db.call(fn.set_fleet_storage, "local", Jsonb(storage), None)
    store = S3Store(S3Location(seaweed.endpoint, BUCKET, prefix), S3Credentials(ACCESS_KEY, SECRET_KEY))
    src = tmp_path / "project"
    src.mkdir()
    (src / "train.py").write_text("print('hi')\n")
    (src / "requirements.txt").write_text("six==1.16.0\n")
    source = ("--source", str(src), "--entrypoint", "python train.py", "--fleet", "local")
    result = cli("preview", *source, "--requirements", "requirements.txt", "--json")
    assert result.exit_code == 0, result.output
    resolved = json.loads(result.stdout)["resolved"]
    sha = resolved["input"]["archive"]["sha256"]
    assert store.exists(sha)
    # The requirements file was read from the archive in the store: its pin is in the lock.
    assert resolved["runtime"]["environment"]["packages"]["six"] == "1.16.0"
    assert _files_under(tmp_path / "data" / "blobs") == []
