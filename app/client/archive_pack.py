"""Packing a source directory into a tar.gz for `tuneplane preview|submit --source DIR`.

Skipped: `.git`, `__pycache__`, virtual environments (any directory holding `pyvenv.cfg`, and `.venv`,
`venv`), and whatever `.tuneplaneignore` at the top of the directory names. The archive is
reproducible (sorted members, zero timestamps and owners), so packing the same tree twice gives the
same sha256 and the server stores it once.

`.tuneplaneignore`: one glob per line, `#` starts a comment. A pattern without `/` matches a file or
directory name anywhere; a pattern with `/` matches the path from the top (a leading `/` is allowed);
a trailing `/` matches directories only. Negation (`!`) is not supported.
"""

from __future__ import annotations

import fnmatch
import gzip
import os
import stat
import tarfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

ALWAYS_SKIPPED = {
    ".git",
    "__pycache__",
    ".venv",
    "venv",
    ".tox",
    ".mypy_cache",
    ".pytest_cache",
    ".ruff_cache",
}
IGNORE_FILE = ".tuneplaneignore"


class PackError(ValueError):
    pass


@dataclass(frozen=True)
class IgnoreRule:
    pattern: str
    anchored: bool
    dirs_only: bool

    def matches(self, rel: str, is_dir: bool) -> bool:
        if self.dirs_only and not is_dir:
            return False
        if self.anchored:
            return fnmatch.fnmatchcase(rel, self.pattern)
        return fnmatch.fnmatchcase(rel.rsplit("/", 1)[-1], self.pattern)


def read_ignore_rules(root: Path) -> list[IgnoreRule]:
    path = root / IGNORE_FILE
    if not path.is_file():
        return []
    rules = []
    for raw in path.read_text(encoding="utf-8").splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("!"):
            raise PackError(f"{path}: negated patterns ({line}) are not supported")
        dirs_only = line.endswith("/")
        line = line.rstrip("/")
        anchored = "/" in line
        rules.append(IgnoreRule(line.lstrip("/"), anchored, dirs_only))
    return rules


def _is_virtualenv(path: Path) -> bool:
    return (path / "pyvenv.cfg").is_file()


@dataclass
class PackResult:
    files: int = 0
    bytes: int = 0
    skipped: list[str] = field(default_factory=list)


def _info(name: str, st: os.stat_result) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.mtime = 0
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    info.mode = 0o755 if (stat.S_ISDIR(st.st_mode) or st.st_mode & 0o111) else 0o644
    return info


def pack_directory(root: Path, out: BinaryIO) -> PackResult:
    """Write ROOT as a reproducible tar.gz to OUT."""
    root = Path(root)
    if not root.is_dir():
        raise PackError(f"{root} is not a directory")
    rules = read_ignore_rules(root)
    result = PackResult()

    def skipped(rel: str, path: Path, is_dir: bool) -> bool:
        name = rel.rsplit("/", 1)[-1]
        if is_dir and (name in ALWAYS_SKIPPED or _is_virtualenv(path)):
            return True
        return any(rule.matches(rel, is_dir) for rule in rules)

    with (
        gzip.GzipFile(fileobj=out, mode="wb", mtime=0) as gz,
        tarfile.open(fileobj=gz, mode="w", format=tarfile.PAX_FORMAT) as tar,
    ):
        for dirpath, dirnames, filenames in os.walk(root):
            base = Path(dirpath)
            rel_base = base.relative_to(root).as_posix()
            prefix = "" if rel_base == "." else rel_base + "/"
            kept_dirs = []
            for name in sorted(dirnames):
                path = base / name
                rel = prefix + name
                if path.is_symlink():
                    filenames.append(name)  # packed as a link, never followed
                    continue
                if skipped(rel, path, True):
                    result.skipped.append(rel + "/")
                    continue
                kept_dirs.append(name)
                tar.addfile(_with_type(_info(rel, path.lstat()), tarfile.DIRTYPE))
            dirnames[:] = kept_dirs
            for name in sorted(filenames):
                path = base / name
                rel = prefix + name
                if skipped(rel, path, False):
                    result.skipped.append(rel)
                    continue
                st = path.lstat()
                info = _info(rel, st)
                if stat.S_ISLNK(st.st_mode):
                    info.type = tarfile.SYMTYPE
                    info.linkname = os.readlink(path)
                    tar.addfile(info)
                elif stat.S_ISREG(st.st_mode):
                    info.size = st.st_size
                    with open(path, "rb") as handle:
                        tar.addfile(info, handle)
                    result.bytes += st.st_size
                else:
                    raise PackError(
                        f"{path} is not a regular file, directory or link; remove it or ignore it"
                    )
                result.files += 1
    return result


def _with_type(info: tarfile.TarInfo, kind: bytes) -> tarfile.TarInfo:
    info.type = kind
    return info
