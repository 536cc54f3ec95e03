"""Host and GPU samples of a member: CPU and RSS of its tagged processes from /proc (a real busy process),
GPU utilisation, memory and power through NVML (a stand-in object, named so, with pynvml's calls)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from tuneplane.workers.collector.system import SystemSampler, load_nvml
from tuneplane.workers.proctree import TAG_VARIABLE, tagged

BUSY = "import time\nend = time.time() + 30\nblob = bytearray(64 * 2**20)\nwhile time.time() < end: pass\n"


def _ticks(pid: int) -> int:
    fields = Path(f"/proc/{pid}/stat").read_bytes().rsplit(b")", 1)[1].split()
    return int(fields[11]) + int(fields[12])


class NvmlStandIn:
    """Stands in for pynvml on a machine without NVIDIA GPUs: the same calls, fixed readings per GPU."""

    def __init__(self) -> None:
        self.asked: list[int] = []

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        self.asked.append(index)
        if index == 7:
            raise RuntimeError("NVML_ERROR_GPU_IS_LOST")
        return index

    def nvmlDeviceGetUtilizationRates(self, handle: int) -> SimpleNamespace:
        return SimpleNamespace(gpu=40 + handle, memory=10)

    def nvmlDeviceGetMemoryInfo(self, handle: int) -> SimpleNamespace:
        return SimpleNamespace(used=(handle + 1) * 2**30, total=80 * 2**30)

    def nvmlDeviceGetPowerUsage(self, handle: int) -> int:
        if handle == 2:
            raise RuntimeError("NVML_ERROR_NOT_SUPPORTED")  # a board that does not report power
        return 250_500 + handle  # milliwatts

    def nvmlDeviceGetEnforcedPowerLimit(self, handle: int) -> int:
        if handle == 2:
            raise RuntimeError("NVML_ERROR_NOT_SUPPORTED")
        return 700_000  # milliwatts


@pytest.fixture
def busy_member():
    tag = f"m1.test{os.getpid()}"
    process = subprocess.Popen([sys.executable, "-c", BUSY], env={**os.environ, TAG_VARIABLE: tag})
    time.sleep(0.3)  # its 64 MiB are touched
    yield tag
    process.kill()
    process.wait(10)


def test_cpu_and_rss_of_the_members_processes_and_gpus_through_nvml(busy_member: str) -> None:
    nvml = NvmlStandIn()
    sampler = SystemSampler(busy_member, [0, 1, 2, 7], nvml)
    (pid,) = tagged(busy_member)
    before, at = _ticks(pid), time.monotonic()
    first = sampler.sample()
    assert "system/cpu_percent" not in first  # CPU needs two samples
    time.sleep(0.5)
    second = sampler.sample()
    # What the process itself says it used over (about) the same time, whatever the machine's load.
    expected = (_ticks(pid) - before) / os.sysconf("SC_CLK_TCK") / (time.monotonic() - at) * 100
    assert expected > 1
    assert abs(second["system/cpu_percent"] - expected) <= max(10.0, 0.3 * expected)
    assert second["system/rss_bytes"] > 64 * 2**20
    assert second["system/gpu.0.utilization"] == 40 and second["system/gpu.1.utilization"] == 41
    assert second["system/gpu.1.memory_used"] == 2 * 2**30
    assert second["system/gpu.0.power_watts"] == pytest.approx(250.5)
    assert second["system/gpu.1.power_limit_watts"] == 700.0  # the idle policy's power fraction needs it
    # A board without power readings still reports utilisation and memory.
    assert second["system/gpu.2.utilization"] == 42 and "system/gpu.2.power_watts" not in second
    assert not any(name.startswith("system/gpu.7") for name in second)  # a lost GPU is skipped, not fatal


def test_without_gpus_only_cpu_and_rss_appear(busy_member: str) -> None:
    sampler = SystemSampler(busy_member, [], None)
    sampler.sample()
    time.sleep(0.2)
    assert set(sampler.sample()) == {"system/cpu_percent", "system/rss_bytes"}


def test_nvml_is_absent_here_and_that_is_not_an_error() -> None:
    if os.path.exists("/dev/nvidiactl"):
        pytest.skip("this machine has an NVIDIA driver")
    assert load_nvml() is None


def test_a_member_that_runs_ten_seconds_gets_several_samples(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, busy_member: str
) -> None:
    """With the default 10 s interval the first samples come at 0, 1, 3 and 7 s (then every 10 s): before,
    a member that ran 10 seconds had one sample, without CPU (which needs two). The collector's clock is
    stepped by the test (0.1 s at a time), the samples are real and spooled."""
    from tuneplane.workers.collector import collector as module
    from tuneplane.workers.collector.collector import Collector, CollectorConfig, sample_delay

    assert [sample_delay(n, 10.0) for n in range(6)] == [1.0, 2.0, 4.0, 8.0, 10.0, 10.0]
    assert sample_delay(100, 10.0) == 10.0 and sample_delay(0, 0.5) == 0.5
    clock = {"now": 1000.0}
    monkeypatch.setattr(module.time, "monotonic", lambda: clock["now"])
    (tmp_path / "out").mkdir()
    config = CollectorConfig(
        tmp_path / "out", tmp_path / "spool", "http://127.0.0.1:9", "t", member_tag=busy_member
    )
    collector = Collector(config)
    try:
        taken = []
        for tenth in range(100):  # ten seconds
            clock["now"] = 1000.0 + tenth / 10
            before = collector.records_spooled
            collector.sample_system()
            if collector.records_spooled > before:
                taken.append(round(clock["now"] - 1000.0, 1))
        assert taken == [0.0, 1.0, 3.0, 7.0]
    finally:
        collector.tracker.close()
        collector.spool.close()
