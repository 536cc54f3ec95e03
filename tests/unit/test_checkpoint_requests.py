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
    assert [(p.key, p.name, p.root) for p in found] == [
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
    reasons = [p.refused for p in pending_checkpoints(member, {}) if p.root is None]
    assert len(reasons) == 3
    assert "inside the output directory" in reasons[0] and "inside the output directory" in reasons[1]
    assert "must be 1-41 letters" in reasons[2]


def test_the_request_file_carries_the_step_the_workload_gives(member: Path) -> None:
    out = member / "output"
    (out / "checkpoint-1200").mkdir()
    with_step = sdk.checkpoint(out / "checkpoint-1200", name="ckpt", step=1200)
    without = sdk.checkpoint(out / "checkpoint-1200", name="ckpt")
    requests = out / ".tuneplane" / "checkpoints" / "requests"
    assert json.loads((requests / f"{with_step}.json").read_text()) == {
        "path": "checkpoint-1200", "name": "ckpt", "step": 1200,
    }  # fmt: skip
    assert "step" not in json.loads((requests / f"{without}.json").read_text())  # reads as before
    assert [p.step for p in pending_checkpoints(member, {})] == [1200, None]
    for bad in (-1, 1.5, "7", True):
        with pytest.raises(ValueError, match="step must be a whole number"):
            sdk.checkpoint(out / "checkpoint-1200", name="ckpt", step=bad)  # type: ignore[arg-type]


def test_a_marker_may_carry_the_step_and_a_bad_step_in_a_request_is_refused(member: Path) -> None:
    out = member / "output"
    (out / "ckpt" / "step-20").mkdir(parents=True)
    (out / "ckpt" / "step-20" / MARKER).write_text(json.dumps({"step": 20}))
    requests = out / ".tuneplane" / "checkpoints" / "requests"
    requests.mkdir(parents=True)
    (requests / "1.json").write_text(json.dumps({"path": "ckpt/step-20", "name": "x", "step": "20"}))
    request, marker = pending_checkpoints(member, {})
    assert request.root is None and "checkpoint step '20' must be a whole number" in request.refused
    assert (marker.key, marker.step) == ("marker:ckpt/step-20", 20)


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
