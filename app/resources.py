"""Where the non-Python parts (sql/, templates/, static/) are, in a checkout and in an installed wheel."""

from __future__ import annotations

from pathlib import Path

_PACKAGE = Path(__file__).resolve().parent


def resource_dir(name: str) -> Path:
    """The directory `name` (sql, templates, static): inside the wheel, or at the checkout's top level."""
    for candidate in (_PACKAGE / "_data" / name, _PACKAGE.parent / name):
        if candidate.is_dir():
            return candidate
    raise FileNotFoundError(f"TunePlane resource directory {name!r} is missing from this installation")
