"""Metrics from JSON-lines files: `{"step": 10, "loss": 0.3, "eval": {"loss": 0.4}}` per line.

Only bytes up to the last newline are consumed: a torn last line is the writer mid-write, so it is left
for the next read. Every numeric field except the step and time keys becomes a point (nested objects are
flattened with "/"). What cannot become a point is refused alone and counted with its reason (see
app.telemetry.limits): a line that is not a JSON object with an integer step, a step outside the
documented range (every field of that line), a bad name, a number too large for a float64, a value that
is not a number. NaN and ±Infinity are points like any other.
"""

from __future__ import annotations

import itertools
import json
import math
from collections.abc import Iterable

import numpy as np
import orjson

from tuneplane.app.telemetry import limits
from tuneplane.workers.collector.columns import PointColumns

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
    # per series where the points are collected (columns.PointColumns), not here per point.
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
    except (ValueError, RecursionError):  # also too many digits for Python's int parser, or too deep
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


_NUMBERS = frozenset((int, float))


def parse_lines(lines: list[bytes], read_time: float, columns: PointColumns) -> None:
    """The points of every line into `columns` (unit i is lines[i]), exactly as parse_line reads each.

    The common line — a flat object of numbers with an integer step — is decoded with orjson and its
    points gathered in bulk, grouped by the line's keys, so the cost per point is a few numpy operations.
    Every other line (NaN, nested objects, strings, booleans, numbers orjson does not take, a blank or
    broken line, a step outside the range) goes through parse_line, which defines what a line means."""
    groups = _uniform_block(lines)
    slow: list[int] = []
    if groups is None:
        groups, slow = _group_line_by_line(lines)
    for keys, (indices, rows) in groups.items():
        slow.extend(_add_flat_lines(keys, indices, rows, read_time, columns))
    for i in sorted(slow):
        raw = lines[i]
        if not raw.strip():
            continue
        step, wall, metrics, refused = parse_line(raw, read_time)
        for name, reason in refused:
            columns.refuse(i, name, reason)
        for name, value in metrics:
            columns.add(i, name, step, value, wall)  # type: ignore[arg-type]


_Groups = dict[tuple[str, ...], tuple[list[int], list[tuple]]]


def _uniform_block(lines: list[bytes]) -> _Groups | None:
    """The lines grouped by their keys when every line is an object of numbers (decoded with C loops
    only); None as soon as one is not."""
    try:
        objs = list(map(orjson.loads, lines))
    except orjson.JSONDecodeError:
        return None
    if set(map(type, objs)) != {dict}:
        return None
    rows = list(map(tuple, map(dict.values, objs)))
    if not set(map(type, itertools.chain.from_iterable(rows))) <= _NUMBERS:
        return None
    keys = list(map(tuple, objs))
    if len(set(keys)) == 1:
        return {keys[0]: (list(range(len(lines))), rows)}
    return _by_keys(range(len(lines)), keys, rows)


def _by_keys(indices: Iterable[int], keys: Iterable[tuple[str, ...]], rows: Iterable[tuple]) -> _Groups:
    groups: _Groups = {}
    for i, key, row in zip(indices, keys, rows, strict=True):
        group = groups.get(key)
        if group is None:
            group = groups[key] = ([], [])
        group[0].append(i)
        group[1].append(row)
    return groups


def _group_line_by_line(lines: list[bytes]) -> tuple[_Groups, list[int]]:
    """The flat number-only lines grouped by their keys, and the indices of every other line."""
    slow: list[int] = []
    flat: list[tuple[int, tuple[str, ...], tuple]] = []
    for i, raw in enumerate(lines):
        try:
            obj = orjson.loads(raw)
        except orjson.JSONDecodeError:
            slow.append(i)
            continue
        if type(obj) is not dict:
            slow.append(i)
            continue
        values = tuple(obj.values())
        if set(map(type, values)) <= _NUMBERS:
            flat.append((i, tuple(obj), values))
        else:
            slow.append(i)
    return _by_keys(*zip(*flat, strict=True)) if flat else {}, slow


def _add_flat_lines(
    keys: tuple[str, ...], indices: list[int], rows: list[tuple], read_time: float, columns: PointColumns
) -> list[int]:
    """Add the points of lines that share `keys` and hold only numbers; returns the lines left for
    parse_line (a step that is not an integer, a step outside the range, no metric at all)."""
    step_at = next((keys.index(k) for k in STEP_KEYS if k in keys), None)
    metric_at = [j for j, k in enumerate(keys) if k not in SKIP_KEYS]
    if step_at is None or not metric_at:
        return indices
    steps = np.array([row[step_at] for row in rows])
    if steps.dtype != np.int64:
        return indices  # a float step somewhere, or one past int64: parse_line decides
    in_range = (steps >= limits.STEP_MIN) & (steps <= limits.STEP_MAX)
    units = np.asarray(indices, dtype=np.int64)
    left: list[int] = []
    if not in_range.all():
        left = units[~in_range].tolist()
        keep = np.flatnonzero(in_range)
        units, steps, rows = units[keep], steps[keep], [rows[k] for k in keep.tolist()]
        if not rows:
            return left
    table = np.array(rows, dtype=np.float64)
    walls = np.full(len(rows), read_time, dtype=np.float64)
    for key in reversed(TIME_KEYS):  # the first time key with a finite value wins, as in parse_line
        if key in keys:
            column = table[:, keys.index(key)]
            walls = np.where(np.isfinite(column), column, walls)
    k = len(metric_at)
    columns.add_many(
        np.repeat(units, k),
        [keys[j] for j in metric_at],
        np.tile(np.arange(k), len(rows)),
        np.repeat(steps, k),
        table[:, metric_at].ravel(),
        np.repeat(walls, k),
    )
    return left
