"""Canonical JSON: the one text a preview digest is computed over.

Keys sorted by code point, no whitespace, non-ASCII kept as UTF-8, numbers in PostgreSQL's numeric text
form (1e-05 → 0.00001). The stored function `tuneplane.canonical_json` writes the same text; a client
can recompute a preview's digest from its resolved document with `digest_of`.
"""

from __future__ import annotations

import hashlib
import json
from decimal import Decimal
from typing import Any


def canonical_json(value: Any) -> str:
    if isinstance(value, dict):
        items = sorted(value.items(), key=lambda kv: kv[0])
        return "{" + ",".join(f"{_string(k)}:{canonical_json(v)}" for k, v in items) + "}"
    if isinstance(value, list | tuple):
        return "[" + ",".join(canonical_json(v) for v in value) + "]"
    if isinstance(value, str):
        return _string(value)
    if value is True:
        return "true"
    if value is False:
        return "false"
    if value is None:
        return "null"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if value != value or value in (float("inf"), float("-inf")):
            raise ValueError("NaN and infinity have no JSON form")
        return format(Decimal(repr(value)), "f")
    raise TypeError(f"{type(value).__name__} has no canonical JSON form")


def _string(value: str) -> str:
    if not isinstance(value, str):
        raise TypeError("object keys must be strings")
    return json.dumps(value, ensure_ascii=False)


def digest_of(value: Any) -> str:
    """sha256 hex of the canonical JSON text."""
    return hashlib.sha256(canonical_json(value).encode()).hexdigest()
