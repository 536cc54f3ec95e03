"""The plain-file checkpoint protocol between a workload (tuneplane.sdk) and the node agent
(workers.agent.checkpoints): what the SDK writes, what the agent picks up, and what it refuses."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tuneplane import sdk
from tuneplane.workers.agent.checkpoints import MARKER, pending_checkpoints
from tuneplane.workers.artifacts.checkpoint import changes, snapshot


@pytest.fixture
def member(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    directory = tmp_path / "member"
    (directory / "output").mkdir(parents=True)
    (directory / "capsule").mkdir()
    (directory / "capsule" / "spec.json").write_text(
        json.dumps({"outputs": [{"name": "ckpt", "path": "ckpt"}]})
    )
    monkeypatch.setenv("TUNEPLANE_OUTPUT_DIR", str(directory / "output"))
    monkeypatch.setattr(sdk, "_requested", [])
    return directory


def test_sdk_requests_and_markers_are_found_in_order_and_only_once(member: Path) -> None:
    out = member / "output"
    (out / "step-10").mkdir()
    (out / "step-10" / "w.bin").write_bytes(b"w")
    first = sdk.checkpoint(out / "step-10", name="checkpoint")
    (out / "ckpt" / "step-20").mkdir(parents=True)
    (out / "ckpt" / "step-20" / MARKER).write_text("")
    (out / "ckpt" / "step-30").mkdir()  # no marker yet: not complete
    found = pending_checkpoints(member, {})
    assert [(key, name, path) for key, name, path, _why in found] == [
        (f"request:{first}", "checkpoint", out / "step-10"),
        ("marker:ckpt/step-20", "ckpt", out / "ckpt" / "step-20"),
    ]
    assert pending_checkpoints(member, {key: {} for key, *_ in found}) == []


def test_paths_outside_the_output_directory_and_bad_names_are_refused(member: Path, tmp_path: Path) -> None:
    out = member / "output"
    with pytest.raises(ValueError, match="inside"):
        sdk.checkpoint(tmp_path, name="x")
    requests = out / ".tuneplane" / "checkpoints" / "requests"
    requests.mkdir(parents=True)
    (out / "escape").symlink_to(tmp_path)  # a link out of the output directory
    (requests / "1.json").write_text(json.dumps({"path": "escape", "name": "x"}))
    (requests / "2.json").write_text(json.dumps({"path": "../../etc", "name": "x"}))
    (requests / "3.json").write_text(json.dumps({"path": ".", "name": "bad name!"}))
    reasons = [why for _key, _name, path, why in pending_checkpoints(member, {}) if path is None]
    assert len(reasons) == 3
    assert "inside the output directory" in reasons[0] and "inside the output directory" in reasons[1]
    assert "must be 1-41 letters" in reasons[2]


def test_a_user_request_is_seen_once_by_the_sdk(member: Path) -> None:
    control = member / "output" / ".tuneplane"
    control.mkdir(parents=True)
    sdk._seen_requests = 0
    assert not sdk.checkpoint_requested()
    (control / "checkpoint-requested").write_text(json.dumps({"requests": 1}))
    assert sdk.checkpoint_requested() and not sdk.checkpoint_requested()


def test_snapshot_changes_name_added_removed_and_modified_files(tmp_path: Path) -> None:
    (tmp_path / "a").write_bytes(b"1")
    (tmp_path / "b").write_bytes(b"2")
    before = snapshot(tmp_path)
    (tmp_path / "a").write_bytes(b"11")
    (tmp_path / "b").unlink()
    (tmp_path / "c").write_bytes(b"3")
    os.sync()
    assert changes(before, snapshot(tmp_path)) == ["modified: a", "removed: b", "added: c"]
