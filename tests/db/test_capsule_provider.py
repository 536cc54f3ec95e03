"""The node gateway serves a capsule only to a node holding a member that uses it (in-process gateway,
real HTTP on loopback, real node credentials)."""

from __future__ import annotations

import asyncio
import hashlib
from pathlib import Path

import aiohttp
from aiohttp.test_utils import TestServer

from tests.launch_fixtures import make_job, make_user, members_of
from tests.node_helpers import enroll, make_fleet, make_token
from tuneplane.app.blobstore import FilesystemBlobStore
from tuneplane.app.db import Database
from tuneplane.app.node_gateway.aiodb import AsyncDatabase
from tuneplane.app.node_gateway.server import Gateway


def _store(blobs: FilesystemBlobStore, data: bytes) -> str:
    sha = hashlib.sha256(data).hexdigest()
    with blobs.stage() as (staged, handle):
        handle.write(data)
        handle.flush()
        blobs.commit_staged(staged, sha)
    return sha


def test_capsule_is_served_only_to_the_node_of_a_member_that_uses_it(
    db: Database, db_url: str, tmp_path: Path
) -> None:
    fleet = make_fleet(db)
    nodes = {}
    for name in ("n0", "n1"):
        row, credential = enroll(db, make_token(db), name)
        nodes[name] = (row["node_id"], credential)
    # Test setup: the nodes' capacity as their agents would have reported it.
    db.fetch_all("UPDATE nodes SET cpus = 8, memory_bytes = 2^34, last_heartbeat_at = now() RETURNING 1")
    blobs = FilesystemBlobStore(tmp_path / "blobs")
    payload = b"capsule bytes " * 1000
    digest = _store(blobs, payload)
    other = _store(blobs, b"someone else's capsule")
    job_id = make_job(db, make_user(db), fleet["id"], gpus_per_node=0)
    (placed,) = db.call("reserve_next", fleet["id"], 1000)
    epoch = db.call("claim_launch", placed["attempt_id"], "w")[0]["epoch"]
    db.call("begin_prepare", placed["attempt_id"], epoch, digest)
    (member,) = members_of(db, job_id)
    holder = next(name for name, (node_id, _c) in nodes.items() if node_id == member["node_id"])
    stranger = next(name for name in nodes if name != holder)

    async def scenario() -> dict:
        gateway = Gateway(AsyncDatabase(db_url, max_size=2), name="gw", blob_dir=tmp_path / "blobs")
        server = TestServer(gateway.make_app(), host="127.0.0.1")
        await server.start_server()
        results = {}
        try:
            async with aiohttp.ClientSession() as http:
                for label, node, name in (
                    ("holder", holder, digest),
                    ("stranger", stranger, digest),
                    ("other", holder, other),
                    ("malformed", holder, "../../etc/passwd"),
                ):
                    headers = {"Authorization": f"Bearer {nodes[node][1]}"}
                    url = f"http://127.0.0.1:{server.port}/v1/files/capsule/{name}"
                    async with http.get(url, headers=headers) as response:
                        results[label] = (response.status, await response.read())
                async with http.get(f"http://127.0.0.1:{server.port}/v1/files/capsule/{digest}") as response:
                    results["anonymous"] = (response.status, b"")
        finally:
            await server.close()
        return results

    results = asyncio.run(scenario())
    assert results["holder"] == (200, payload)
    assert (
        results["stranger"][0] == 403
        and b"belongs to no member placed on this node" in results["stranger"][1]
    )
    assert results["other"][0] == 403
    assert results["malformed"][0] == 404
    assert results["anonymous"][0] == 401
