"""Test setup for artifacts: a member running on a node that holds a real node credential.

Built on tests.launch_fixtures (plain-SQL setup); the behaviour under test is always a stored function
or the server code that calls them.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from tests.launch_fixtures import make_job, make_node, make_user, members_of
from tuneplane.app.db import Database
from tuneplane.app.security import new_token
from tuneplane.workers.artifacts.manifest import Manifest, build_manifest


@dataclass
class MemberSetup:
    user_id: int
    fleet_id: int
    node_id: int
    job_id: int
    member: dict
    credential: str
    credential_hash: str


def make_fleet_with(db: Database, name: str, capabilities: dict) -> int:
    row = db.fetch_one(
        "INSERT INTO fleets (name, backend, capabilities) VALUES (%s, 'node', %s) RETURNING id",
        (name, json.dumps(capabilities)),
    )
    return row["id"]


def give_credential(db: Database, node_id: int) -> tuple[str, str]:
    plaintext, digest = new_token("tpn")
    db.fetch_one(
        "INSERT INTO node_credentials (node_id, credential_hash) VALUES (%s, %s) RETURNING id",
        (node_id, digest),
    )
    return plaintext, digest


def make_member(
    db: Database,
    *,
    user: str = "alice",
    fleet: str = "gpu",
    capabilities: dict | None = None,
    user_id: int | None = None,
    fleet_id: int | None = None,
    node_id: int | None = None,
) -> MemberSetup:
    if user_id is None:
        user_id = make_user(db, user)
    if fleet_id is None:
        fleet_id = make_fleet_with(db, fleet, capabilities or {"object_delivery": True})
    if node_id is None:
        node_id = make_node(db, fleet_id, f"{fleet}-node", gpus=2)
    credential, credential_hash = give_credential(db, node_id)
    job_id = make_job(db, user_id, fleet_id, nodes=1, gpus_per_node=1)
    db.call("reserve_next", fleet_id, 1000)
    member = members_of(db, job_id)[0]
    return MemberSetup(user_id, fleet_id, node_id, job_id, member, credential, credential_hash)


def write_tree(root: Path, files: dict[str, bytes]) -> Manifest:
    for rel, data in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    return build_manifest(root)


@contextmanager
def serve_app(app, port: int) -> Iterator[str]:
    """The Flask app on a real loopback port (waitress in a thread), for clients that speak real HTTP."""
    import waitress.server

    server = waitress.server.create_server(app, host="127.0.0.1", port=port, threads=4)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.close()
        thread.join(timeout=5)


def api_token(db: Database, user_id: int) -> str:
    plaintext, digest = new_token("tpu")
    db.call("issue_api_token", user_id, "test", digest)
    return plaintext


def recorded_complete(
    db: Database,
    setup: MemberSetup,
    name: str,
    manifest: Manifest,
    kind: str = "output",
    step: int | None = None,
) -> dict:
    """An artifact made complete at the database level only (as if the server had verified every file):
    for tests of what reads artifacts (previews, the dialog), not of delivery. `step`: a checkpoint's."""
    from psycopg.types.json import Jsonb

    art = db.call(
        "register_artifact", setup.credential_hash, setup.member["id"], name, kind, "object",
        Jsonb(manifest.as_json()), manifest.digest, None, step,
    )[0]  # fmt: skip
    for index, entry in enumerate(manifest.files):
        art = db.call(
            "record_artifact_file", setup.credential_hash, art["id"], index, entry.sha256, entry.size
        )[0]
    return art


@contextmanager
def served_artifacts(db: Database, db_url: str, tmp_path: Path, port: int, chunk: int) -> Iterator[dict]:
    """The console server (real HTTP on loopback) with its blob store under tmp_path and small chunks:
    {"url", "blob_dir", "tmp"} for artifact tests."""
    from tuneplane.app.web import create_app

    db.fetch_one("UPDATE artifact_settings SET chunk_size = %s RETURNING chunk_size", (chunk,))
    blob_dir = tmp_path / "blobs"
    app = create_app(db_url, config={"SECRET_KEY": "t", "TP_BLOB_DIR": str(blob_dir)})
    with serve_app(app, port) as url:
        yield {"url": url, "blob_dir": blob_dir, "tmp": tmp_path}
