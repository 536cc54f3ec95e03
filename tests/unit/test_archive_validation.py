"""Archive validation refuses each attack with its reason; packing skips what it should."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import pytest

from tests import archive_builders as ab
from tuneplane.app.client.archive_pack import PackError, pack_directory
from tuneplane.app.submission.archives import ArchiveLimits, ArchiveRefused, validate_archive

LIMITS = ArchiveLimits(max_bytes=512 * 1024**2, max_members=5000, max_unpacked_bytes=8 * 1024**2)


def check(tmp_path: Path, data: bytes, limits: ArchiveLimits = LIMITS) -> tuple[int, int]:
    path = tmp_path / "a.tar.gz"
    path.write_bytes(data)
    return validate_archive(str(path), limits)


def refused(tmp_path: Path, data: bytes, limits: ArchiveLimits = LIMITS) -> str:
    with pytest.raises(ArchiveRefused) as err:
        check(tmp_path, data, limits)
    assert err.value.field == "archive" and err.value.status == 422
    return err.value.message


def test_honest_archive_passes_with_its_counts(tmp_path: Path) -> None:
    members, unpacked = check(tmp_path, ab.honest())
    assert members == 3 and unpacked == len(b"print('hello from the source archive')\n") + len(b"X = 1\n")


@pytest.mark.parametrize(
    ("build", "reason"),
    [
        (ab.dotdot, "'..' component"),
        (ab.absolute, "absolute path"),
        (ab.symlink_escape, "points outside the archive"),
        (ab.hardlink_escape, "points outside the archive"),
        (ab.device_file, "device file"),
    ],
)
def test_attacks_are_refused_with_their_reason(tmp_path: Path, build, reason: str) -> None:
    assert reason in refused(tmp_path, build())


def test_too_many_members_are_refused(tmp_path: Path) -> None:
    assert "more than 5000 members" in refused(tmp_path, ab.many_tiny_files(10_000))


def test_small_archive_expanding_past_the_limit_is_refused(tmp_path: Path) -> None:
    data = ab.bomb(16 * 1024**2)
    assert len(data) < 64 * 1024
    assert "expands to more than" in refused(tmp_path, data)


def test_symlink_to_absolute_path_is_refused(tmp_path: Path) -> None:
    assert "absolute path" in refused(tmp_path, ab.build([ab.link("x", "/etc/passwd")]))


def test_garbage_is_not_a_tar_gz(tmp_path: Path) -> None:
    assert "not a gzip-compressed tar" in refused(tmp_path, b"this is not an archive")


def test_packing_skips_git_caches_virtualenvs_and_ignored_paths(tmp_path: Path) -> None:
    src = tmp_path / "src"
    for rel in [
        "train.py",
        "data/keep.csv",
        "data/big.bin",
        ".git/HEAD",
        "pkg/__pycache__/m.pyc",
        "env/pyvenv.cfg",
        "env/lib/x.py",
        "logs/run.log",
        "notes.tmp",
        "pkg/mod.py",
    ]:
        path = src / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(rel)
    (src / ".tuneplaneignore").write_text("# local things\n*.tmp\nlogs/\n/data/big.bin\n")
    out = io.BytesIO()
    result = pack_directory(src, out)
    out.seek(0)
    with tarfile.open(fileobj=out, mode="r:gz") as tar:
        names = {m.name for m in tar.getmembers() if m.isfile()}
    assert names == {"train.py", "data/keep.csv", "pkg/mod.py", ".tuneplaneignore"}
    assert result.files == 4 and "logs/" in result.skipped and "env/" in result.skipped


def test_packing_is_reproducible(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.py").write_text("a")
    first, second = io.BytesIO(), io.BytesIO()
    pack_directory(src, first)
    (src / "a.py").touch()  # a new mtime must not change the archive
    pack_directory(src, second)
    assert first.getvalue() == second.getvalue()


def test_negated_ignore_patterns_are_refused_not_misread(tmp_path: Path) -> None:
    (tmp_path / ".tuneplaneignore").write_text("!keep.me\n")
    with pytest.raises(PackError):
        pack_directory(tmp_path, io.BytesIO())


def test_a_200_mib_pax_header_is_refused_from_its_declared_size(tmp_path: Path) -> None:
    import resource

    data = ab.huge_extended_header()
    assert len(data) < 1024**2
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    limits = ArchiveLimits(max_bytes=512 * 1024**2, max_members=5000, max_unpacked_bytes=1024**3)
    assert "extended header" in refused(tmp_path, data, limits)
    grown_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
    assert grown_kib < 50 * 1024


def test_a_huge_gnu_long_name_is_refused_before_it_is_read(tmp_path: Path) -> None:
    data = ab.huge_extended_header(64 * 1024**2, tarfile.GNUTYPE_LONGNAME)
    limits = ArchiveLimits(max_bytes=512 * 1024**2, max_members=5000, max_unpacked_bytes=1024**3)
    assert "extended header" in refused(tmp_path, data, limits)


def test_a_member_name_over_4096_bytes_is_refused(tmp_path: Path) -> None:
    assert "longer than 4096" in refused(tmp_path, ab.long_member_name())


def test_symlink_chains_that_escape_are_refused_as_an_extractor_resolves_them(tmp_path: Path) -> None:
    assert "chain of links" in refused(tmp_path, ab.symlink_chain_escape())
    assert "outside the archive" in refused(tmp_path, ab.write_through_link_chain())
    # A link to a link that stays inside is fine.
    inside = ab.build([ab.file("pkg/a.py"), ab.link("pkg/b.py", "a.py"), ab.link("c.py", "pkg/b.py")])
    assert check(tmp_path, inside)[0] == 3


def test_data_after_the_end_of_archive_marker_is_refused(tmp_path: Path) -> None:
    assert "after the end-of-archive marker" in refused(tmp_path, ab.with_trailing(b"hidden payload"))
    hidden = ab.with_trailing(ab.build([ab.file("evil.py")]))  # a second tar after the marker
    assert "after the end-of-archive marker" in refused(tmp_path, hidden)
    assert check(tmp_path, ab.with_trailing(bytes(4096)))[0] == 1  # more zero padding is fine


def test_a_foreign_block_between_members_is_refused(tmp_path: Path) -> None:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        info = tarfile.TarInfo("a.py")
        info.size = 1
        archive.addfile(info, io.BytesIO(b"x"))
    raw = buffer.getvalue()
    damaged = raw[:1024] + b"\x01" * 512 + raw[1024:]
    import gzip

    assert "not a valid tar stream" in refused(tmp_path, gzip.compress(damaged))
