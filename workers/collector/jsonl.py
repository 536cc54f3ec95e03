"""Metrics from JSON-lines files: `{"step": 10, "loss": 0.3, "eval": {"loss": 0.4}}` per line.

Only bytes up to the last newline are consumed: a torn last line is the writer mid-write, so it is left
for the next read. Every numeric field except the step and time keys becomes a point (nested objects are
flattened with "/"). What cannot become a point is refused alone and counted with its reason (see
app.telemetry.limits): a line that is not a JSON object with an integer step, a step outside the
documented range (every field of that line), a bad name, a number too large for a float64, a value that
is not a number. NaN and ±Infinity are points like any other.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator

from app.telemetry import limits

STEP_KEYS = ("step", "global_step")
TIME_KEYS = ("wall_time", "time", "timestamp")
SKIP_KEYS = frozenset(STEP_KEYS + TIME_KEYS)
LINE_NOT_JSON = "line is not a JSON object"
LINE_NO_STEP = "line has no integer step"

_DECODER = json.JSONDecoder()


def _loads(raw: bytes) -> object:
    """json.loads for one UTF-8 line at half its cost (no encoding detection, no wrapper): the decoder's
    raw_decode, then nothing but whitespace may follow."""
    text = raw.decode("utf-8-sig")  # a UnicodeDecodeError is a ValueError too
    start = len(text) - len(text.lstrip(" \t\r\n"))
    obj, end = _DECODER.raw_decode(text, start)
    if text[end:].strip(" \t\r\n"):
        raise ValueError("extra data after the JSON value")
    return obj


# (step, wall time, [(name, value)], [(name, reason)]); step None when the whole line is refused.
ParsedLine = tuple[int | None, float, list[tuple[str, float]], list[tuple[str, str]]]


def _flatten(prefix: str, obj: dict, metrics: list, refused: list) -> None:
    # The hot path of the collector: a type test per field. Whether a name may be stored is checked once
    # per series where the points are collected (sources._Columns), not here per point.
    for key, value in obj.items():
        kind = type(value)
        if kind is float:
            metrics.append((prefix + key, value))
        elif kind is int:
            try:
                metrics.append((prefix + key, float(value)))
            except OverflowError:
                refused.append((prefix + key, limits.VALUE_TOO_LARGE))
        elif kind is dict:
            _flatten(prefix + key + "/", value, metrics, refused)
        else:
            refused.append((prefix + key, limits.NOT_A_NUMBER))


def parse_line(raw: bytes, read_time: float) -> ParsedLine:
    """The points of one line, and what was refused in it (with reasons)."""
    try:
        obj = _loads(raw)
    except ValueError:  # also a number with more digits than Python's int parser allows
        obj = None
    if type(obj) is not dict:
        return None, read_time, [], [("", LINE_NOT_JSON)]
    step = None
    for key in STEP_KEYS:
        candidate = obj.get(key)
        if type(candidate) is int:
            step = candidate
            break
        if type(candidate) is float and candidate.is_integer():
            step = int(candidate)
            break
    if step is None:
        return None, read_time, [], [("", LINE_NO_STEP)]
    wall_time = read_time
    for key in TIME_KEYS:
        candidate = obj.get(key)
        if type(candidate) is float or type(candidate) is int:
            try:
                if math.isfinite(candidate):
                    wall_time = float(candidate)
                    break
            except OverflowError:
                continue
    metrics: list[tuple[str, float]] = []
    refused: list[tuple[str, str]] = []
    _flatten("", {k: v for k, v in obj.items() if k not in SKIP_KEYS}, metrics, refused)
    if not limits.step_ok(step):
        refused += [(name, limits.STEP_RANGE) for name, _ in metrics] or [("", limits.STEP_RANGE)]
        metrics = []
    return step, wall_time, metrics, refused


def split_lines(buffer: bytes, base_offset: int) -> Iterator[tuple[int, bytes]]:
    """(offset just past the line, line) for each complete line; the torn tail is not yielded."""
    start = 0
    while True:
        end = buffer.find(b"\n", start)
        if end < 0:
            return
        yield base_offset + end + 1, buffer[start:end]
        start = end + 1
