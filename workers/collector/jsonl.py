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
from dataclasses import dataclass, field

from app.telemetry import limits

STEP_KEYS = ("step", "global_step")
TIME_KEYS = ("wall_time", "time", "timestamp")
LINE_NOT_JSON = "line is not a JSON object"
LINE_NO_STEP = "line has no integer step"


@dataclass
class ParsedLine:
    step: int | None = None
    wall_time: float = 0.0
    metrics: list[tuple[str, float]] = field(default_factory=list)
    refused: list[tuple[str, str]] = field(default_factory=list)  # (name or "", reason)


def _flatten(prefix: str, obj: dict, line: ParsedLine) -> None:
    for key, value in obj.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            _flatten(name + "/", value, line)
            continue
        problem = limits.name_problem(name)
        if problem is None and (isinstance(value, bool) or not isinstance(value, int | float)):
            problem = limits.NOT_A_NUMBER
        if problem is None:
            try:
                number = float(value)
            except OverflowError:
                problem = limits.VALUE_TOO_LARGE
        if problem is not None:
            line.refused.append((name if limits.name_problem(name) is None else "", problem))
        else:
            line.metrics.append((name, number))


def parse_line(raw: bytes, read_time: float) -> ParsedLine:
    """The points of one line, and what was refused in it (with reasons)."""
    line = ParsedLine(wall_time=read_time)
    try:
        obj = json.loads(raw)
    except ValueError:  # also a number with more digits than Python's int parser allows
        obj = None
    if not isinstance(obj, dict):
        line.refused.append(("", LINE_NOT_JSON))
        return line
    for key in STEP_KEYS:
        candidate = obj.get(key)
        if isinstance(candidate, int) and not isinstance(candidate, bool):
            line.step = candidate
            break
        if isinstance(candidate, float) and candidate.is_integer():
            line.step = int(candidate)
            break
    if line.step is None:
        line.refused.append(("", LINE_NO_STEP))
        return line
    for key in TIME_KEYS:
        candidate = obj.get(key)
        numeric = isinstance(candidate, int | float) and not isinstance(candidate, bool)
        try:
            if numeric and math.isfinite(candidate):
                line.wall_time = float(candidate)
                break
        except OverflowError:
            continue
    rest = {k: v for k, v in obj.items() if k not in STEP_KEYS and k not in TIME_KEYS}
    _flatten("", rest, line)
    if not limits.step_ok(line.step):
        line.refused += [(name, limits.STEP_RANGE) for name, _ in line.metrics] or [("", limits.STEP_RANGE)]
        line.metrics = []
    return line


def split_lines(buffer: bytes, base_offset: int) -> Iterator[tuple[int, bytes]]:
    """(offset just past the line, line) for each complete line; the torn tail is not yielded."""
    start = 0
    while True:
        end = buffer.find(b"\n", start)
        if end < 0:
            return
        yield base_offset + end + 1, buffer[start:end]
        start = end + 1
