"""Simulated GPUs: NVML-shaped samples written as telemetry through the real telemetry gateway.

There is no GPU here. The idle policy reads only the samples stored as telemetry (sql/functions/idle.sql),
so recorded samples shaped exactly as the collector writes them (workers/collector/system.py: source
`system`, names system/gpu.<i>.utilization, .memory_used, .power_watts, .power_limit_watts, step = the
sample's time in milliseconds) are an honest input: the sweep, the stored functions and the gateway are
the real ones. These are fakes of one thing only: NVML's readings.
"""

from __future__ import annotations

import itertools
import time
import uuid
from dataclasses import dataclass

import httpx

from tuneplane.app.telemetry import wire

SOURCE = "system"
_seq = itertools.count(1)


@dataclass
class Reading:
    """One GPU's NVML reading: utilization (%), memory used (bytes), power (W), its board's limit (W)."""

    utilization: float
    power_watts: float
    memory_used: float = 4 * 2**30
    power_limit_watts: float = 700.0


IDLE = Reading(utilization=0.0, power_watts=70.0)  # 10 % of a 700 W board, nothing running
BUSY = Reading(utilization=97.0, power_watts=610.0)


def gpu_samples(gpu: int, reading: Reading) -> dict[str, float]:
    return {
        f"system/gpu.{gpu}.utilization": reading.utilization,
        f"system/gpu.{gpu}.memory_used": reading.memory_used,
        f"system/gpu.{gpu}.power_watts": reading.power_watts,
        f"system/gpu.{gpu}.power_limit_watts": reading.power_limit_watts,
    }


def post_samples(
    gateway_url: str,
    token: str,
    readings: dict[int, Reading],
    start: float,
    end: float,
    every: float = 10.0,
    collector: str | None = None,
) -> int:
    """Samples of the member's GPUs (gpu index → reading) every `every` seconds from `start` to `end`
    (seconds since the epoch), as one batch through the gateway, as a collector would have sent them one
    by one. Returns the number of samples per GPU."""
    times = []
    t = start
    while t <= end + 1e-6:
        times.append(t)
        t += every
    series: list[tuple[str, str, int]] = []
    steps: list[int] = []
    values: list[float] = []
    walls: list[float] = []
    for gpu, reading in sorted(readings.items()):
        for name, value in sorted(gpu_samples(gpu, reading).items()):
            series.append((SOURCE, name, len(times)))
            steps += [int(x * 1000) for x in times]
            values += [value] * len(times)
            walls += times
    payload = wire.encode(
        collector or f"sim-{uuid.uuid4().hex[:8]}", next(_seq), series, steps, values, walls
    )
    response = httpx.post(
        f"{gateway_url}/v1/telemetry/batches",
        content=payload,
        headers={"Authorization": f"Bearer {token}", "Content-Type": wire.CONTENT_TYPE},
        timeout=30,
    )
    response.raise_for_status()
    return len(times)


def now() -> float:
    return time.time()
