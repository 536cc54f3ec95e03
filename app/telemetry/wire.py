"""The batch wire format, shared by the collector's spool, the SDK and the telemetry gateway.

    b"TPB1" | u32 LE header length | header (UTF-8 JSON) | steps (int64 LE)[n] | values (f64 LE)[n]
            | wall times (f64 LE)[n]

The header names the batch (`collector`, `seq`), optionally the scope it was written for, and the series in
order as `[source, name, count]`; the arrays hold the points of those series one after another. Columns
rather than rows keep encoding and decoding in numpy, so neither side spends per-point Python time.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass, field

import numpy as np

MAGIC = b"TPB1"
CONTENT_TYPE = "application/x-tuneplane-batch"
MAX_BATCH_BYTES = 64 * 1024 * 1024
MAX_NAME_LEN = 512
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
) -> bytes:
    header = {"collector": collector, "seq": seq, "series": [list(s) for s in series]}
    if scope:
        header["scope"] = scope
    if health:
        header["health"] = health
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
    except ValueError as exc:
        raise WireError(f"batch header is not JSON: {exc}") from exc
    if not isinstance(header, dict):
        raise WireError("batch header must be a JSON object")
    collector = header.get("collector")
    seq = header.get("seq")
    series = header.get("series")
    if not isinstance(collector, str) or not 1 <= len(collector) <= 200:
        raise WireError("collector must be a string of 1-200 characters", "collector")
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
        if not entry[0] or not entry[1] or len(entry[0]) > MAX_NAME_LEN or len(entry[1]) > MAX_NAME_LEN:
            raise WireError(f"series source and name must be 1-{MAX_NAME_LEN} characters", "series")
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
    scope = header.get("scope")
    if scope is not None and not isinstance(scope, dict):
        raise WireError("scope must be an object", "scope")
    health = header.get("health") or {}
    if not isinstance(health, dict):
        raise WireError("health must be an object", "health")
    return Batch(collector, seq, checked, steps, values, walls, scope, health)
