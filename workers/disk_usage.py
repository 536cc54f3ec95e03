"""What a file or directory tree holds on disk: its newest change and its bytes, in one walk. Used by the
clean-ups that remove what is old enough (blob GC's leftovers, the agent's caches and member directories)."""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class TreeUsage:
    newest: float  # the newest mtime of the path and of anything under it
    bytes: int  # the sizes of the regular files (and links) under it


def tree_usage(path: Path) -> TreeUsage:
    """One walk over `path` (a file or a directory). Raises FileNotFoundError if `path` itself is gone;
    entries that vanish during the walk are skipped."""
    top = path.stat()
    if not path.is_dir():
        return TreeUsage(top.st_mtime, top.st_size)
    newest, size = top.st_mtime, 0
    for dirpath, dirnames, filenames in os.walk(path):
        for names, is_file in ((dirnames, False), (filenames, True)):
            for name in names:
                with contextlib.suppress(OSError):
                    st = os.lstat(os.path.join(dirpath, name))
                    newest = max(newest, st.st_mtime)
                    size += st.st_size if is_file else 0
    return TreeUsage(newest, size)
