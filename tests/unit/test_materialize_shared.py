"""materialize_shared: a Slurm step places the checkpoint its attempt resumes from by copying it from the
shared path and verifying it against the manifest pinned with it (no server, no credential)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tuneplane.workers.artifacts.manifest import build_manifest
from tuneplane.workers.artifacts.materialize import MaterializeError, materialize_shared


def published(tmp_path: Path) -> tuple[dict, dict]:
    root = tmp_path / "shared" / "members" / "0" / "output" / "checkpoints" / "step-7"
    (root / "sub").mkdir(parents=True)
    (root / "state.json").write_text('{"step": 7}')
    (root / "sub" / "weights.bin").write_bytes(b"\x00\x01" * 1000)
    manifest = build_manifest(root)
    pin = {"name": "checkpoint.1", "artifact_id": 5, "manifest_digest": manifest.digest, "delivery": "shared",
           "shared_path": str(root)}  # fmt: skip
    return pin, manifest.as_json()


def test_a_shared_checkpoint_is_copied_and_verified(tmp_path: Path) -> None:
    pin, manifest = published(tmp_path)
    report = materialize_shared(pin, manifest, tmp_path / "member" / "resume")
    assert report.ok and report.checked == 2
    assert (tmp_path / "member" / "resume" / "state.json").read_text() == '{"step": 7}'
    # Again on a directory that verifies: nothing to do.
    assert materialize_shared(pin, manifest, tmp_path / "member" / "resume").ok


def test_a_manifest_that_is_not_the_pinned_one_is_refused(tmp_path: Path) -> None:
    pin, manifest = published(tmp_path)
    with pytest.raises(MaterializeError, match="the job pinned"):
        materialize_shared({**pin, "manifest_digest": "0" * 64}, manifest, tmp_path / "resume")
    assert not (tmp_path / "resume").exists()


def test_a_checkpoint_changed_on_the_shared_path_fails_naming_the_file(tmp_path: Path) -> None:
    pin, manifest = published(tmp_path)
    (Path(pin["shared_path"]) / "state.json").write_text('{"step": 8}')
    with pytest.raises(MaterializeError, match=r"state\.json"):
        materialize_shared(pin, manifest, tmp_path / "resume")


def test_a_checkpoint_not_on_the_shared_path_is_refused_with_its_delivery(tmp_path: Path) -> None:
    pin, manifest = published(tmp_path)
    with pytest.raises(MaterializeError, match="delivery object"):
        materialize_shared({**pin, "delivery": "object", "shared_path": None}, manifest, tmp_path / "resume")
