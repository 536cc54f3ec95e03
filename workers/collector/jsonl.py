"""Metrics from JSON-lines files: `{"step": 10, "loss": 0.3, "eval": {"loss": 0.4}}` per line.

Only bytes up to the last newline are consumed: a torn last line is the writer mid-write, so it is left
for the next read. Every numeric field except the step and time keys becomes a point (nested objects are
flattened with "/"). A line that is not a JSON object with an integer step is skipped and counted.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator

STEP_KEYS = ("step", "global_step")
TIME_KEYS = ("wall_time", "time", "timestamp")


def _flatten(prefix: str, obj: dict, out: list[tuple[str, float]]) -> None:
    for key, value in obj.items():
        name = f"{prefix}{key}"
        if isinstance(value, bool):
            continue
        if isinstance(value, int | float):
            out.append((name, float(value)))
        elif isinstance(value, dict):
            _flatten(name + "/", value, out)


def parse_line(line: bytes, read_time: float) -> tuple[int, float, list[tuple[str, float]]] | None:
    """(step, wall_time, [(name, value)]) or None for a line that holds no usable metrics."""
    try:
        obj = json.loads(line)
    except ValueError:
        return None
    if not isinstance(obj, dict):
        return None
    step = None
    for key in STEP_KEYS:
        candidate = obj.get(key)
        if isinstance(candidate, int) and not isinstance(candidate, bool):
            step = candidate
            break
        if isinstance(candidate, float) and candidate.is_integer():
            step = int(candidate)
            break
    if step is None:
        return None
    wall_time = read_time
    for key in TIME_KEYS:
        candidate = obj.get(key)
        numeric = isinstance(candidate, int | float) and not isinstance(candidate, bool)
        if numeric and math.isfinite(candidate):
            wall_time = float(candidate)
            break
    metrics: list[tuple[str, float]] = []
    rest = {k: v for k, v in obj.items() if k not in STEP_KEYS and k not in TIME_KEYS}
    _flatten("", rest, metrics)
    return step, wall_time, metrics


def split_lines(buffer: bytes, base_offset: int) -> Iterator[tuple[int, bytes]]:
    """(offset just past the line, line) for each complete line; the torn tail is not yielded."""
    start = 0
    while True:
        end = buffer.find(b"\n", start)
        if end < 0:
            return
        yield base_offset + end + 1, buffer[start:end]
        start = end + 1
