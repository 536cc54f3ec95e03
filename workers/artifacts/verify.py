"""Verification: recompute every file of a manifest and report each mismatching, missing and extra file."""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

from tuneplane.workers.artifacts.manifest import READ_BLOCK, Manifest, ManifestError, walk_files


@dataclass(frozen=True)
class Mismatch:
    path: str
    expected_size: int
    actual_size: int
    expected_sha256: str
    actual_sha256: str

    def describe(self) -> str:
        if self.expected_size != self.actual_size:
            return f"{self.path}: size {self.actual_size}, manifest says {self.expected_size}"
        return f"{self.path}: sha256 {self.actual_sha256[:16]}…, manifest says {self.expected_sha256[:16]}…"


@dataclass
class VerifyReport:
    checked: int = 0
    bytes_checked: int = 0
    mismatched: list[Mismatch] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    extra: list[str] = field(default_factory=list)
    # Paths that exist but could not be read (or escaped the directory); reported, never skipped.
    unreadable: list[str] = field(default_factory=list)
    allow_extra: bool = False

    @property
    def ok(self) -> bool:
        return not (
            self.mismatched or self.missing or self.unreadable or (self.extra and not self.allow_extra)
        )

    def problems(self) -> list[str]:
        lines = [f"mismatch: {m.describe()}" for m in self.mismatched]
        lines += [f"missing: {p}" for p in self.missing]
        lines += [f"unreadable: {p}" for p in self.unreadable]
        if not self.allow_extra:
            lines += [f"extra: {p}" for p in self.extra]
        return lines

    def summary(self) -> str:
        if self.ok:
            return f"ok: {self.checked} files, {self.bytes_checked} bytes match the manifest"
        return f"verification failed: {len(self.problems())} problem(s): " + "; ".join(self.problems())

    def as_json(self) -> dict:
        return {
            "ok": self.ok,
            "checked": self.checked,
            "bytes_checked": self.bytes_checked,
            "mismatched": [m.__dict__ for m in self.mismatched],
            "missing": list(self.missing),
            "extra": list(self.extra),
            "unreadable": list(self.unreadable),
            "problems": self.problems(),
        }


def hash_stream(stream: BinaryIO) -> tuple[str, int]:
    digest = hashlib.sha256()
    size = 0
    while block := stream.read(READ_BLOCK):
        digest.update(block)
        size += len(block)
    return digest.hexdigest(), size


def verify_with(
    manifest: Manifest,
    open_file: Callable[[str], BinaryIO | None],
    present_paths: Iterable[str] = (),
    *,
    allow_extra: bool = False,
) -> VerifyReport:
    """Verify through `open_file(path)` (None when the file is missing); `present_paths` finds extras."""
    report = VerifyReport(allow_extra=allow_extra)
    expected = manifest.by_path()
    for entry in manifest.files:
        try:
            stream = open_file(entry.path)
        except OSError:
            report.unreadable.append(entry.path)
            continue
        if stream is None:
            report.missing.append(entry.path)
            continue
        with stream:
            try:
                sha, size = hash_stream(stream)
            except OSError:
                report.unreadable.append(entry.path)
                continue
        report.checked += 1
        report.bytes_checked += size
        if sha != entry.sha256 or size != entry.size:
            report.mismatched.append(Mismatch(entry.path, entry.size, size, entry.sha256, sha))
    report.extra = sorted(p for p in present_paths if p not in expected)
    return report


def verify_directory(root: Path | str, manifest: Manifest, *, allow_extra: bool = False) -> VerifyReport:
    """Recompute every manifest file under root; list missing files and files the manifest lacks."""
    root_path = Path(root)
    if not root_path.is_dir():
        report = VerifyReport(allow_extra=allow_extra)
        report.missing = [f.path for f in manifest.files]
        return report
    try:
        present = [rel for rel, _full in walk_files(root_path)]
        escaped: list[str] = []
    except ManifestError as exc:
        # A link escaping the directory: verify what can be verified and report the offender.
        present, escaped = [], [str(exc)]

    def open_file(path: str) -> BinaryIO | None:
        full = root_path / path
        if not full.is_file():
            return None
        return open(full, "rb")

    report = verify_with(manifest, open_file, present, allow_extra=allow_extra)
    report.unreadable.extend(escaped)
    return report
