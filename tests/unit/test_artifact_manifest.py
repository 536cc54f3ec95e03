from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest

from tuneplane.workers.artifacts.manifest import (
    Manifest,
    ManifestError,
    ManifestFile,
    build_manifest,
    check_relative_path,
    normalize_digest,
)
from tuneplane.workers.artifacts.verify import verify_directory


def make_tree(root: Path) -> None:
    (root / "sub" / "deeper").mkdir(parents=True)
    (root / "weights.bin").write_bytes(os.urandom(200_000))
    (root / "sub" / "config.json").write_text('{"lr": 0.1}')
    (root / "sub" / "deeper" / "empty").write_bytes(b"")
    (root / "sub" / "naïve ü.txt").write_text("unicode name")


def test_manifest_lists_every_file_with_size_and_sha256(tmp_path: Path) -> None:
    make_tree(tmp_path)
    manifest = build_manifest(tmp_path)
    paths = [f.path for f in manifest.files]
    assert paths == sorted(["weights.bin", "sub/config.json", "sub/deeper/empty", "sub/naïve ü.txt"])
    entry = manifest.by_path()["weights.bin"]
    data = (tmp_path / "weights.bin").read_bytes()
    assert entry.size == len(data) and entry.sha256 == hashlib.sha256(data).hexdigest()
    assert manifest.by_path()["sub/deeper/empty"].sha256 == hashlib.sha256(b"").hexdigest()


def test_manifest_digest_is_sha256_of_canonical_json(tmp_path: Path) -> None:
    make_tree(tmp_path)
    manifest = build_manifest(tmp_path)
    text = manifest.canonical_bytes()
    assert text.startswith(b'{"files":[{"path":"sub/config.json","sha256":"')
    assert text.endswith(b'],"version":1}') and b" " not in text.replace(b"na\xc3\xafve \xc3\xbc", b"")
    assert manifest.digest == hashlib.sha256(text).hexdigest()
    again = Manifest.from_json(json.loads(text))
    assert again == manifest and again.digest == manifest.digest


def test_digest_changes_when_one_byte_changes(tmp_path: Path) -> None:
    make_tree(tmp_path)
    before = build_manifest(tmp_path).digest
    path = tmp_path / "sub" / "config.json"
    path.write_text('{"lr": 0.2}')
    assert build_manifest(tmp_path).digest != before


def test_symlink_inside_directory_is_followed(tmp_path: Path) -> None:
    make_tree(tmp_path)
    (tmp_path / "link.bin").symlink_to("weights.bin")
    manifest = build_manifest(tmp_path)
    assert manifest.by_path()["link.bin"].sha256 == manifest.by_path()["weights.bin"].sha256


def test_symlink_escaping_the_directory_is_refused(tmp_path: Path) -> None:
    root = tmp_path / "artifact"
    root.mkdir()
    (tmp_path / "secret").write_text("outside")
    (root / "ok.txt").write_text("ok")
    (root / "leak").symlink_to(tmp_path / "secret")
    with pytest.raises(ManifestError, match="leak: symlink points outside"):
        build_manifest(root)


def test_directory_symlink_escaping_and_loops_are_refused(tmp_path: Path) -> None:
    root = tmp_path / "artifact"
    (root / "a").mkdir(parents=True)
    (root / "a" / "loop").symlink_to(root / "a")
    with pytest.raises(ManifestError, match="symlink loop"):
        build_manifest(root)
    (root / "a" / "loop").unlink()
    (root / "up").symlink_to(tmp_path)
    with pytest.raises(ManifestError, match="up: symlink points outside"):
        build_manifest(root)


def test_fifo_is_refused(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "pipe")
    with pytest.raises(ManifestError, match="pipe: not a regular file"):
        build_manifest(tmp_path)


@pytest.mark.parametrize("bad", ["/abs", "a/../b", "./a", "a//b", "", "tab\there", "a/"])
def test_unsafe_paths_are_refused(bad: str) -> None:
    with pytest.raises(ManifestError):
        check_relative_path(bad)


def test_manifest_from_json_refuses_duplicates_bad_hashes_and_file_dir_clash() -> None:
    sha = "0" * 64
    with pytest.raises(ManifestError, match="listed twice"):
        Manifest((ManifestFile("a", 1, sha), ManifestFile("a", 1, sha)))
    with pytest.raises(ManifestError, match="sha256 must be"):
        Manifest((ManifestFile("a", 1, "XYZ"),))
    with pytest.raises(ManifestError, match="file and used as a directory"):
        Manifest((ManifestFile("a", 1, sha), ManifestFile("a/b", 1, sha)))
    with pytest.raises(ManifestError, match="an empty file's sha256 is"):
        Manifest((ManifestFile("a", 0, sha),))
    with pytest.raises(ManifestError, match="unknown keys"):
        Manifest.from_json({"version": 1, "files": [], "extra": 1})


def test_normalize_digest_accepts_prefix() -> None:
    assert normalize_digest("sha256:" + "A" * 64) == "a" * 64
    with pytest.raises(ManifestError):
        normalize_digest("abc")


def test_verify_passes_on_untouched_copy(tmp_path: Path) -> None:
    make_tree(tmp_path)
    report = verify_directory(tmp_path, build_manifest(tmp_path))
    assert report.ok and report.checked == 4 and report.problems() == []


def test_verify_names_every_changed_missing_and_extra_file(tmp_path: Path) -> None:
    make_tree(tmp_path)
    manifest = build_manifest(tmp_path)
    weights = tmp_path / "weights.bin"
    data = bytearray(weights.read_bytes())
    data[12345] ^= 0x01
    weights.write_bytes(bytes(data))
    (tmp_path / "sub" / "config.json").write_text('{"lr": 0.1, "more": true}')
    (tmp_path / "sub" / "deeper" / "empty").unlink()
    (tmp_path / "stray.txt").write_text("not in manifest")
    report = verify_directory(tmp_path, manifest)
    assert not report.ok
    assert [m.path for m in report.mismatched] == ["sub/config.json", "weights.bin"]
    assert report.missing == ["sub/deeper/empty"]
    assert report.extra == ["stray.txt"]
    problems = "\n".join(report.problems())
    assert "mismatch: weights.bin: sha256" in problems and "mismatch: sub/config.json: size" in problems
    assert "missing: sub/deeper/empty" in problems and "extra: stray.txt" in problems


def test_verify_of_missing_directory_lists_all_files_missing(tmp_path: Path) -> None:
    make_tree(tmp_path)
    report = verify_directory(tmp_path / "nope", build_manifest(tmp_path))
    assert not report.ok and len(report.missing) == 4
