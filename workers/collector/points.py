"""A scalar point as the collector reads it, before it is spooled and shipped."""

from __future__ import annotations

from typing import NamedTuple


class Point(NamedTuple):
    source: str  # e.g. "tensorboard:." or "jsonl:metrics.jsonl" or "sdk"
    name: str  # the raw name the workload wrote (tag or JSON key)
    step: int
    wall_time: float  # seconds since the epoch, as the writer recorded it (NaN if unknown)
    value: float
