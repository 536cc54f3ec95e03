"""Reading a JobSpec file for the CLI (`--spec FILE.yaml|json`): every problem is one line naming the
file and the reason, never a traceback.

YAML is richer than JSON: `2024-01-01` loads as a date, `!!binary` as bytes, `.inf` as infinity, and a
set or a custom tag may appear. None of those can travel in a JobSpec, so each is refused with the key
path where it sits (quote the value to mean the text).
"""

from __future__ import annotations

import datetime as dt
import json
import math
from pathlib import Path
from typing import Any

import yaml

MAX_SPEC_BYTES = 4 * 1024 * 1024


class SpecFileError(Exception):
    """A JobSpec file that cannot be used; the message is the whole story."""


def load_spec_file(path: str) -> dict:
    kind = "JSON" if path.endswith(".json") else "YAML"
    try:
        raw = Path(path).read_bytes()
    except OSError as exc:
        raise SpecFileError(f"{path}: cannot read it ({exc.strerror or exc})") from None
    if len(raw) > MAX_SPEC_BYTES:
        raise SpecFileError(f"{path}: larger than {MAX_SPEC_BYTES} bytes; a JobSpec is a small file")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise SpecFileError(f"{path}: not UTF-8 text (byte {exc.start} is {raw[exc.start]:#04x})") from None
    try:
        data = json.loads(text) if kind == "JSON" else yaml.safe_load(text)
    except (json.JSONDecodeError, yaml.YAMLError) as exc:
        reason = " ".join(str(exc).split())
        raise SpecFileError(f"{path}: not valid {kind} ({reason[:300]})") from None
    except RecursionError:
        raise SpecFileError(f"{path}: nested too deeply") from None
    if not isinstance(data, dict):
        raise SpecFileError(f"{path}: a JobSpec is a mapping of fields, not {_kind(data)}")
    _check_plain(data, path)
    return data


def _kind(value: Any) -> str:
    return "nothing" if value is None else f"a {type(value).__name__}"


def _check_plain(data: Any, path: str) -> None:
    """Refuse what YAML can hold but JSON (and so a JobSpec) cannot, naming its key path."""
    stack: list[tuple[Any, str]] = [(data, "")]
    while stack:
        value, where = stack.pop()
        at = where or "the top level"
        if isinstance(value, dict):
            for key, child in value.items():
                if not isinstance(key, str):
                    raise SpecFileError(f"{path}: at {at}: key {key!r} is not text (quote it)")
                stack.append((child, f"{where}.{key}" if where else key))
        elif isinstance(value, list):
            stack.extend((child, f"{where}[{i}]") for i, child in enumerate(value))
        elif isinstance(value, dt.date | dt.datetime):
            raise SpecFileError(f"{path}: {at} is a date ({value}); quote it if you mean the text")
        elif isinstance(value, bytes):
            raise SpecFileError(f"{path}: {at} is binary data (!!binary); a JobSpec holds text")
        elif isinstance(value, float) and not math.isfinite(value):
            raise SpecFileError(f"{path}: {at} is {value}; a JobSpec number must be finite")
        elif not isinstance(value, str | int | float | bool) and value is not None:
            raise SpecFileError(f"{path}: {at} is a {type(value).__name__}, which a JobSpec cannot hold")
