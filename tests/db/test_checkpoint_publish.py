"""The agent's checkpoint publishing (workers.agent.checkpoints.publish_pending) against the real server:
a request becomes artifact NAME.N and its result is written back for the SDK; a refusal that will not
change (a fleet without object delivery) is recorded as failed instead of being retried forever."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from tests.artifact_fixtures import api_token, make_member, served_artifacts, write_tree
from tuneplane.app.db import Database
from tuneplane.workers.agent.checkpoints import publish_pending
from tuneplane.workers.agent.prepare import NodeAccess
from tuneplane.workers.artifacts.deliver import node_http


@pytest.fixture
def env(db: Database, db_url: str, tmp_path: Path, port: int):
    with served_artifacts(db, db_url, tmp_path, port, 4096) as served:
        yield served


def member_directory(root: Path, member_id: int) -> Path:
    directory = root / f"member-{member_id}"
    (directory / "output" / "step-1").mkdir(parents=True)
    (directory / "output" / "step-1" / "w.bin").write_bytes(b"weights" * 1000)
    (directory / "member.json").write_text(json.dumps({"member_id": member_id}))
    requests = directory / "output" / ".tuneplane" / "checkpoints" / "requests"
    requests.mkdir(parents=True)
    (requests / "0001.json").write_text(json.dumps({"path": "step-1", "name": "ckpt"}))
    return directory


def test_a_request_is_published_once_and_its_result_written_back(db: Database, env) -> None:
    setup = make_member(db)
    directory = member_directory(env["tmp"], setup.member["id"])
    access = NodeAccess(env["url"], None, lambda: setup.credential)  # type: ignore[arg-type]
    lines: list[str] = []
    assert publish_pending(access, directory, lines.append) == 1
    assert publish_pending(access, directory, lines.append) == 0  # nothing new: nothing again
    result = json.loads(
        (directory / "output" / ".tuneplane" / "checkpoints" / "results" / "0001.json").read_text()
    )
    assert result["state"] == "complete" and result["artifact"] == "ckpt.1"
    row = db.fetch_one("SELECT kind, state FROM artifacts WHERE id = %s", (result["artifact_id"],))
    assert row == {"kind": "checkpoint", "state": "complete"}


def test_a_fleet_without_object_delivery_refuses_and_the_refusal_is_recorded(
    db: Database, env, tmp_path: Path
) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    setup = make_member(
        db,
        fleet="nfs",
        capabilities={"object_delivery": False, "shared_mounts": True, "shared_path": str(shared)},
    )
    directory = member_directory(env["tmp"], setup.member["id"])
    access = NodeAccess(env["url"], None, lambda: setup.credential)  # type: ignore[arg-type]
    assert publish_pending(access, directory, lambda _line: None) == 1
    result = json.loads(
        (directory / "output" / ".tuneplane" / "checkpoints" / "results" / "0001.json").read_text()
    )
    assert result["state"] == "failed" and "object_delivery" in result["reason"]
    assert publish_pending(access, directory, lambda _line: None) == 0


def test_the_step_a_request_carries_is_stored_with_the_checkpoint(db: Database, env) -> None:
    """sdk.checkpoint(path, name, step=N) → the request's "step" → the artifact row's step, and back in
    the result the SDK reads; a request with a bad step is refused with the reason, nothing registered."""
    setup = make_member(db)
    directory = member_directory(env["tmp"], setup.member["id"])
    requests = directory / "output" / ".tuneplane" / "checkpoints" / "requests"
    (requests / "0001.json").write_text(json.dumps({"path": "step-1", "name": "ckpt", "step": 1200}))
    (requests / "0002.json").write_text(json.dumps({"path": "step-1", "name": "bad", "step": -3}))
    access = NodeAccess(env["url"], None, lambda: setup.credential)  # type: ignore[arg-type]
    assert publish_pending(access, directory, lambda _line: None) == 2
    results = directory / "output" / ".tuneplane" / "checkpoints" / "results"
    result = json.loads((results / "0001.json").read_text())
    assert result["state"] == "complete" and result["step"] == 1200
    assert db.fetch_one("SELECT step FROM artifacts WHERE id = %s", (result["artifact_id"],))["step"] == 1200
    # The job page's Artifacts table (and its JSON) shows it beside the name.
    headers = {"Authorization": f"Bearer {api_token(db, setup.user_id)}"}
    url = f"{env['url']}/jobs/{setup.job_id}/artifacts"
    listed = httpx.get(url, headers={**headers, "Accept": "application/json"}).json()["artifacts"]
    assert [(a["name"], a["step"]) for a in listed] == [("ckpt.1", 1200)]
    page = httpx.get(url, headers={**headers, "Accept": "text/html"}).text
    assert 'ckpt.1</a> <span class="muted">step 1200</span>' in page
    refused = json.loads((results / "0002.json").read_text())
    assert refused["state"] == "failed" and "step -3 must be a whole number" in refused["reason"]
    assert db.fetch_one("SELECT count(*) AS n FROM artifacts WHERE name LIKE 'bad%%'")["n"] == 0


@pytest.mark.parametrize(
    ("kind", "step", "field"),
    [("checkpoint", "12", "step"), ("checkpoint", -1, "step"), ("output", 5, "step")],
)
def test_a_bad_step_is_refused_naming_the_field_and_nothing_is_stored(
    db: Database, env, kind: str, step: object, field: str
) -> None:
    """The registration endpoint (what every agent calls): a step that is not a whole number, a negative
    one, or a step on an artifact that is not a checkpoint is a 400 naming `step`."""
    setup = make_member(db)
    manifest = write_tree(env["tmp"] / "tree", {"w.bin": b"w"})
    body = {
        "member_id": setup.member["id"], "name": "ckpt.1", "kind": kind, "delivery": "object",
        "manifest": manifest.as_json(), "manifest_digest": manifest.digest, "step": step,
    }  # fmt: skip
    with node_http(env["url"], setup.credential) as http:
        response = http.post("/api/artifacts", json=body)
    assert response.status_code == 400, response.text
    assert list(response.json()["fields"]) == [field], response.text
    assert db.fetch_one("SELECT count(*) AS n FROM artifacts")["n"] == 0
