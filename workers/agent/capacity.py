"""What this machine offers: CPUs, memory, GPUs (NVML, else nvidia-smi), container runtimes.

Standard library only, so it also runs as a script on a bare GPU host: `python3 capacity.py`.
`--simulate-gpus N` replaces GPU detection with N GPUs marked simulated (tests and benchmarks only).
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess

CONTAINER_RUNTIMES = ("podman", "docker", "apptainer")
SIMULATED_MODEL = "Simulated GPU"
SIMULATED_MEMORY = 80 * 1024**3


def cpu_count() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def memory_bytes() -> int:
    try:
        with open("/proc/meminfo") as handle:
            for line in handle:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def container_runtimes() -> list[str]:
    """The runtimes that answer `info` with TunePlane's settings (installed but broken is not offered)."""
    from tuneplane.workers.runner.runtime import usable_container_runtimes

    return usable_container_runtimes()


def _gpus_from_nvml() -> list[dict] | None:
    try:
        import pynvml  # nvidia-ml-py, optional
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
    except Exception:
        return None
    try:
        gpus = []
        for index in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            name = pynvml.nvmlDeviceGetName(handle)
            gpus.append(
                {
                    "index": index,
                    "model": name.decode() if isinstance(name, bytes) else str(name),
                    "memory_bytes": int(pynvml.nvmlDeviceGetMemoryInfo(handle).total),
                    "simulated": False,
                }
            )
        return gpus
    finally:
        pynvml.nvmlShutdown()


def parse_nvidia_smi(output: str) -> list[dict]:
    """Rows of `nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader,nounits` (MiB)."""
    gpus = []
    for line in output.splitlines():
        if not line.strip():
            continue
        parts = [part.strip() for part in line.split(",")]
        if len(parts) < 3:
            raise ValueError(f"unexpected nvidia-smi row {line!r}")
        # A model name may itself contain a comma: index first, memory last, the name in between.
        index, name, memory_mib = parts[0], ", ".join(parts[1:-1]), parts[-1]
        gpus.append(
            {
                "index": int(index),
                "model": name,
                "memory_bytes": int(float(memory_mib)) * 1024 * 1024,
                "simulated": False,
            }
        )
    return gpus


def _gpus_from_nvidia_smi() -> tuple[list[dict] | None, str | None]:
    binary = shutil.which("nvidia-smi")
    if binary is None:
        return None, None
    try:
        done = subprocess.run(
            [binary, "--query-gpu=index,name,memory.total", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=20,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, f"nvidia-smi failed: {exc}"
    if done.returncode != 0:
        return None, f"nvidia-smi exited {done.returncode}: {done.stderr.strip()[:200]}"
    try:
        return parse_nvidia_smi(done.stdout), None
    except ValueError as exc:
        return None, f"could not parse nvidia-smi output: {exc}"


# The NVIDIA GPUs (by NVML index, comma separated) this agent offers, when it must not offer all of the
# machine's: two agents that split one machine (bench/gpu_check.sh runs a 2-member job on one host so).
NODE_GPUS_VARIABLE = "TUNEPLANE_NODE_GPUS"


def offered(gpus: list[dict], setting: str | None) -> list[dict]:
    """The GPUs named by the setting (all when it is unset or empty); an index the machine lacks is an
    error, said rather than ignored."""
    if not setting or not setting.strip():
        return gpus
    try:
        wanted = {int(part) for part in setting.split(",") if part.strip()}
    except ValueError as exc:
        raise ValueError(
            f"{NODE_GPUS_VARIABLE} must be GPU indices separated by commas, not {setting!r}"
        ) from exc
    missing = wanted - {g["index"] for g in gpus}
    if missing:
        raise ValueError(f"{NODE_GPUS_VARIABLE} names GPU(s) {sorted(missing)} this machine does not have")
    return [g for g in gpus if g["index"] in wanted]


def detect_gpus() -> tuple[list[dict], str | None]:
    """(GPUs, a problem worth reporting or None). No NVIDIA driver at all is not a problem: zero GPUs."""
    gpus = _gpus_from_nvml()
    problem = None
    if gpus is None:
        gpus, problem = _gpus_from_nvidia_smi()
    try:
        return offered(gpus or [], os.environ.get(NODE_GPUS_VARIABLE)), problem
    except ValueError as exc:
        return [], str(exc)


def simulated_gpus(count: int) -> list[dict]:
    return [
        {"index": i, "model": SIMULATED_MODEL, "memory_bytes": SIMULATED_MEMORY, "simulated": True}
        for i in range(count)
    ]


def detect(simulate_gpus: int | None = None, agent_version: str = "unknown") -> tuple[dict, str | None]:
    if simulate_gpus is not None:
        gpus, problem = simulated_gpus(simulate_gpus), None
    else:
        gpus, problem = detect_gpus()
    capacity = {
        "cpus": cpu_count(),
        "memory_bytes": memory_bytes(),
        "gpus": gpus,
        "agent_version": agent_version,
        "container_runtimes": container_runtimes(),
        "hostname": socket.gethostname(),
    }
    return capacity, problem


if __name__ == "__main__":
    found, issue = detect(agent_version="probe")
    print(json.dumps({"capacity": found, "problem": issue}, indent=2))
