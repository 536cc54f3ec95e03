"""The batch wire format, shared by the collector's spool, the SDK and the telemetry gateway.

    b"TPB1" | u32 LE header length | header (UTF-8 JSON) | steps (int64 LE)[n] | values (f64 LE)[n]
            | wall times (f64 LE)[n]

The header names the batch (`collector`, `seq`), optionally the scope it was written for, and the series in
order as `[source, name, count]`; the arrays hold the points of those series one after another. Columns
rather than rows keep encoding and decoding in numpy, so neither side spends per-point Python time.
Optional header entries: `health` (the collector's summary), `refused` (points the collector could not
read, as `[source, name, reason, count]`), `damage` (regions of files it skipped, as `[source, file,
offset, bytes, reason]`) and `final` (the member ended and the collector read every file to its end;
this is its last batch).

Only the structure is checked here (a malformed structure is a 400 for the whole batch); whether each
series' source and name may be stored is decided per series by the gateway (app.telemetry.limits), so one
bad name costs only its own points.
"""

from __future__ import annotations

import json
import re
import struct
from dataclasses import dataclass, field

import numpy as np

from tuneplane.app.errors import Refusal
from tuneplane.app.input_limits import MAX_JSON_DEPTH, check_json_value
from tuneplane.app.telemetry.limits import name_problem, scrub

MAGIC = b"TPB1"
CONTENT_TYPE = "application/x-tuneplane-batch"
MAX_BATCH_BYTES = 64 * 1024 * 1024
# Most refusal and damage entries one batch may carry (a batch with more is malformed: 400).
MAX_ENTRIES = 10_000
# Series names longer than this are refused per series by the gateway; the header bounds what it parses.
MAX_HEADER_STRING = 4096
_HEAD = struct.Struct("<4sI")


class WireError(ValueError):
    """A batch that cannot be decoded; the gateway answers 400 with this message."""

    def __init__(self, message: str, field: str = "batch") -> None:
        super().__init__(message)
        self.field = field


@dataclass
class Batch:
    collector: str
    seq: int
    series: list[tuple[str, str, int]]
    steps: np.ndarray
    values: np.ndarray
    wall_times: np.ndarray
    scope: dict | None = None
    health: dict = field(default_factory=dict)
    refused: list[tuple[str, str, str, int]] = field(default_factory=list)
    damage: list[tuple[str, str, int, int, str]] = field(default_factory=list)
    final: bool = False

    @property
    def count(self) -> int:
        return int(self.steps.shape[0])


def encode(
    collector: str,
    seq: int,
    series: list[tuple[str, str, int]],
    steps: np.ndarray | list[int],
    values: np.ndarray | list[float],
    wall_times: np.ndarray | list[float],
    *,
    scope: dict | None = None,
    health: dict | None = None,
    refused: list | None = None,
    damage: list | None = None,
    final: bool = False,
) -> bytes:
    header: dict = {"collector": collector, "seq": seq, "series": [list(s) for s in series]}
    if scope:
        header["scope"] = scope
    if health:
        header["health"] = health
    if refused:
        header["refused"] = [list(r) for r in refused]
    if damage:
        header["damage"] = [list(d) for d in damage]
    if final:
        header["final"] = True
    head = json.dumps(header, separators=(",", ":")).encode()
    return b"".join(
        (
            _HEAD.pack(MAGIC, len(head)),
            head,
            np.asarray(steps, dtype="<i8").tobytes(),
            np.asarray(values, dtype="<f8").tobytes(),
            np.asarray(wall_times, dtype="<f8").tobytes(),
        )
    )


def decode(payload: bytes) -> Batch:
    if len(payload) < _HEAD.size:
        raise WireError("batch is shorter than its header")
    magic, head_len = _HEAD.unpack_from(payload, 0)
    if magic != MAGIC:
        raise WireError("not a TunePlane batch (bad magic)")
    start = _HEAD.size
    if start + head_len > len(payload):
        raise WireError("batch header length exceeds the body")
    try:
        header = json.loads(payload[start : start + head_len])
    except RecursionError:
        field = _too_deep_under(payload[start : start + head_len])
        raise WireError(f"{field} is nested more than {MAX_JSON_DEPTH} levels deep", field) from None
    except ValueError as exc:
        raise WireError(f"batch header is not JSON: {exc}") from exc
    if not isinstance(header, dict):
        raise WireError("batch header must be a JSON object")
    try:  # the depth only: strings are scrubbed or refused per series below, NaN in health is kept as null
        check_json_value(header, "batch", depth_only=frozenset(header))
    except Refusal as refusal:
        raise WireError(refusal.message, refusal.field or "batch") from None
    collector = header.get("collector")
    seq = header.get("seq")
    series = header.get("series")
    if not isinstance(collector, str) or not 1 <= len(collector) <= 200 or name_problem(collector):
        raise WireError("collector must be 1-200 characters without control characters", "collector")
    if not isinstance(seq, int) or isinstance(seq, bool) or not 0 <= seq < 2**63:
        raise WireError("seq must be a non-negative integer", "seq")
    if not isinstance(series, list):
        raise WireError("series must be a list of [source, name, count]", "series")
    checked: list[tuple[str, str, int]] = []
    total = 0
    for entry in series:
        if (
            not isinstance(entry, list)
            or len(entry) != 3
            or not isinstance(entry[0], str)
            or not isinstance(entry[1], str)
            or not isinstance(entry[2], int)
            or isinstance(entry[2], bool)
            or entry[2] < 0
        ):
            raise WireError("each series must be [source, name, count]", "series")
        if entry[2] == 0:  # collectors and the SDK name a series only with its points
            raise WireError(f"series {len(checked)} names no points (count 0)", "series")
        checked.append((entry[0], entry[1], entry[2]))
        total += entry[2]
    body = start + head_len
    if len(payload) - body != total * 24:
        raise WireError(
            f"batch body holds {len(payload) - body} bytes; {total} points need {total * 24}", "series"
        )
    steps = np.frombuffer(payload, dtype="<i8", count=total, offset=body)
    values = np.frombuffer(payload, dtype="<f8", count=total, offset=body + 8 * total)
    walls = np.frombuffer(payload, dtype="<f8", count=total, offset=body + 16 * total)
    health = header.get("health") or {}
    if not isinstance(health, dict):
        raise WireError("health must be an object", "health")
    return Batch(
        collector,
        seq,
        checked,
        steps,
        values,
        walls,
        _scope(header.get("scope")),
        scrub(health),  # type: ignore[arg-type]
        _refused(header.get("refused")),
        _damage(header.get("damage")),
        header.get("final") is True,
    )


_JSON_TOKENS = re.compile(rb'"(?:[^"\\]|\\.)*"|[\[\]{}]')


def _too_deep_under(head: bytes) -> str:
    """The header entry (`health`, `series`, …) under which a header too deep for the parser nests past
    MAX_JSON_DEPTH: found by counting brackets outside strings (no recursion); `batch` when none."""
    depth, key, last_string = 0, None, None
    for token in _JSON_TOKENS.finditer(head):
        text = token.group()
        if text[:1] == b'"':
            last_string = text if depth == 1 else last_string
        elif text in (b"[", b"{"):
            depth += 1
            key = last_string if depth == 2 else key
            if depth > MAX_JSON_DEPTH:
                return _field_name(key)
        else:
            depth -= 1
    return "batch"


def _field_name(raw: bytes | None) -> str:
    try:
        name = json.loads(raw) if raw else "batch"
    except ValueError:
        return "batch"
    return scrub(name)[:MAX_HEADER_STRING] if isinstance(name, str) else "batch"  # type: ignore[index]


def _is_int(value: object, low: int = 0, high: int = 2**63 - 1) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and low <= value <= high


def _scope(scope: object) -> dict | None:
    if scope is None:
        return None
    if not isinstance(scope, dict):
        raise WireError("scope must be an object", "scope")
    for key, value in scope.items():
        if key not in ("job_id", "attempt", "member"):
            raise WireError(f"scope.{scrub(key)} is not a scope field (job_id, attempt, member)", "scope")
        if not _is_int(value, 0, 2**31 - 1 if key != "job_id" else 2**63 - 1):
            raise WireError(f"scope.{key} must be a non-negative integer", "scope")
    return scope


def _text(value: object, what: str) -> str:
    if not isinstance(value, str) or len(value) > MAX_HEADER_STRING:
        raise WireError(f"{what} must be a string of at most {MAX_HEADER_STRING} characters", what)
    return scrub(value)  # type: ignore[return-value]


def _refused(entries: object) -> list[tuple[str, str, str, int]]:
    if entries is None:
        return []
    if not isinstance(entries, list) or len(entries) > MAX_ENTRIES:
        raise WireError("refused must be a list of [source, name, reason, count]", "refused")
    out = []
    for entry in entries:
        if not isinstance(entry, list) or len(entry) != 4 or not _is_int(entry[3], 1, 2**31 - 1):
            raise WireError("refused must be a list of [source, name, reason, count]", "refused")
        out.append(
            (_text(entry[0], "refused"), _text(entry[1], "refused"), _text(entry[2], "refused"), entry[3])
        )
    return out


def _damage(entries: object) -> list[tuple[str, str, int, int, str]]:
    if entries is None:
        return []
    if not isinstance(entries, list) or len(entries) > MAX_ENTRIES:
        raise WireError("damage must be a list of [source, file, offset, bytes, reason]", "damage")
    out = []
    for entry in entries:
        if (
            not isinstance(entry, list)
            or len(entry) != 5
            or not _is_int(entry[2])
            or not _is_int(entry[3], 1)
        ):
            raise WireError("damage must be a list of [source, file, offset, bytes, reason]", "damage")
        out.append(
            (
                _text(entry[0], "damage"),
                _text(entry[1], "damage"),
                entry[2],
                entry[3],
                _text(entry[4], "damage"),
            )
        )
    return out
