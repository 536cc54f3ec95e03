"""A real, small file system to fill up (ENOSPC): a size-limited tmpfs mounted for one test.

Mounting needs root (CAP_SYS_ADMIN); where it is not allowed the test is skipped, saying why.
"""

from __future__ import annotations

import contextlib
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest


@contextlib.contextmanager
def small_tmpfs(path: Path, size: str = "1m") -> Iterator[Path]:
    """Mount a tmpfs of `size` on `path` (created if missing) for the block; lazily unmounted after it."""
    path.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], capture_output=True, check=False
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here (needs root): {done.stderr.decode().strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], capture_output=True, check=False)


def fill_up(directory: Path) -> Path:
    """Take every byte left on the file system holding `directory`; returns the file that holds them."""
    filler = directory / "filler"
    with open(filler, "wb", buffering=0) as handle:
        for size in (65536, 4096, 512, 1):
            with contextlib.suppress(OSError):
                while True:
                    handle.write(b"\0" * size)
    return filler
