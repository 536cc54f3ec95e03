"""Host and GPU metrics of one member, sampled by its collector and shipped on the same telemetry path.

- CPU and resident memory, always: the member's processes are those carrying its tag in their environment
  (TUNEPLANE_MEMBER_TAG, as the agent starts them); CPU is the change of their user+system time between
  two samples over the wall time between them (100 = one core), RSS the sum of their resident sets.
- GPUs, when NVML is present (`nvidia-ml-py`, imported as `pynvml`): utilisation (%), memory used (bytes)
  and power (W) of each GPU the member was given, and the board's enforced power limit (W), which the
  idle-GPU policy needs to judge power as a fraction (sql/functions/idle.sql). Each reading is taken on its
  own: a board that does not report power (NVML_ERROR_NOT_SUPPORTED) still reports utilisation and memory.
  On a machine without GPUs or without the NVIDIA driver only CPU and RSS appear.

Names (canonical in parentheses): system/cpu_percent (cpu_utilization), system/rss_bytes (memory_rss),
system/gpu.<i>.utilization (gpu_utilization), system/gpu.<i>.memory_used (gpu_memory),
system/gpu.<i>.power_watts and system/gpu.<i>.power_limit_watts (gpu_power). The step of a sample is its
time in milliseconds since the epoch, so a restarted collector never writes two different values at one
step.
"""

from __future__ import annotations

import logging
import os
import time
from typing import Any

from tuneplane.workers.proctree import tagged

log = logging.getLogger(__name__)

SOURCE = "system"
_TICKS = os.sysconf("SC_CLK_TCK")
_PAGE = os.sysconf("SC_PAGE_SIZE")


def load_nvml() -> Any | None:
    """The initialised NVML module, or None where there is no NVIDIA driver (or no nvidia-ml-py)."""
    try:
        import pynvml
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
    except Exception as exc:  # NVMLError_LibraryNotFound, DriverNotLoaded, …: no GPU metrics here
        log.info("no GPU metrics: %s", exc)
        return None
    return pynvml


def _ticks_and_rss(pid: int) -> tuple[int, int] | None:
    """(user+system clock ticks, resident bytes) of one process, None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            stat = handle.read()
        with open(f"/proc/{pid}/statm", "rb") as handle:
            statm = handle.read().split()
    except OSError:
        return None  # it ended between listing and reading
    fields = stat[stat.rfind(b")") + 2 :].split()
    return int(fields[11]) + int(fields[12]), int(statm[1]) * _PAGE


class SystemSampler:
    def __init__(self, member_tag: str | None, gpu_indices: list[int], nvml: Any | None = None) -> None:
        self.member_tag = member_tag
        self.gpu_indices = list(gpu_indices)
        self.nvml = nvml
        self._last: tuple[float, dict[int, int]] | None = None
        self._handles: dict[int, Any] = {}
        self._said: set[tuple[int, str]] = set()  # (GPU, reading) failures already logged

    def sample(self) -> dict[str, float]:
        """One sample: name → value (CPU needs a previous sample, so the first has none)."""
        now = time.monotonic()
        values: dict[str, float] = {}
        if self.member_tag:
            read = {pid: _ticks_and_rss(pid) for pid in tagged(self.member_tag)}
            per_pid = {pid: r[0] for pid, r in read.items() if r is not None}
            values["system/rss_bytes"] = float(sum(r[1] for r in read.values() if r is not None))
            if self._last is not None:
                before_at, before = self._last
                # Only processes seen both times count (one that ended took its ticks with it).
                used = sum(max(0, t - before[p]) for p, t in per_pid.items() if p in before)
                elapsed = now - before_at
                if elapsed > 0:
                    values["system/cpu_percent"] = 100.0 * used / _TICKS / elapsed
            self._last = (now, per_pid)
        if self.nvml is not None:
            values.update(self._gpus())
        return values

    def _gpus(self) -> dict[str, float]:
        nvml = self.nvml
        out: dict[str, float] = {}
        readings = (
            ("utilization", lambda h: float(nvml.nvmlDeviceGetUtilizationRates(h).gpu)),
            ("memory_used", lambda h: float(nvml.nvmlDeviceGetMemoryInfo(h).used)),
            ("power_watts", lambda h: nvml.nvmlDeviceGetPowerUsage(h) / 1000.0),
            ("power_limit_watts", lambda h: nvml.nvmlDeviceGetEnforcedPowerLimit(h) / 1000.0),
        )
        for index in self.gpu_indices:
            try:
                handle = self._handles.get(index)
                if handle is None:
                    handle = self._handles[index] = nvml.nvmlDeviceGetHandleByIndex(index)
            except Exception as exc:  # one GPU's failure must not stop the others or the collector
                self._say(index, "handle", exc)
                continue
            for name, read in readings:
                try:
                    out[f"system/gpu.{index}.{name}"] = read(handle)
                except Exception as exc:  # a reading this board does not offer: the others still count
                    self._say(index, name, exc)
        return out

    def _say(self, index: int, what: str, exc: Exception) -> None:
        """A GPU reading that failed, logged once per (GPU, reading) rather than at every sample."""
        if (index, what) not in self._said:
            self._said.add((index, what))
            log.warning("GPU %s: %s: %s", index, what, exc)
