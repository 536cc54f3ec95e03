"""Checking a job's pinned runtime on this node (the agent at PREPARE, the runner again at start).

Python pin: {"kind": "python", "implementation": "cpython", "python": "3.11", "packages": {name: version}}
— the interpreter that runs the member must be that implementation and minor version, and every pinned
package (version not null) must be installed at exactly that version.
With `environment` (a lock built by the agent into <work-dir>/environments/<digest>, named in member.json):
the environment must be ready, built for that digest and hold every locked package at its version; on an
isolated base the node's interpreter and packages do not matter.
Image pin: {"kind": "image", "image": "registry/name:tag@sha256:…"} — needs a working container runtime
(podman or docker) on the node; without one the member is refused: an image's job never runs on the host.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tuneplane.workers.runner.containers import global_options, runtime_env
from tuneplane.workers.runner.environment_check import EnvironmentMismatch, verify_environment

CONTAINER_RUNTIMES = ("podman", "docker")


class RuntimeRefused(Exception):
    """The pinned runtime cannot be honoured on this node; the message says what differs."""


def python_pin_problems(pin: dict) -> list[str]:
    problems: list[str] = []
    implementation = pin.get("implementation")
    if implementation and implementation != sys.implementation.name:
        problems.append(f"interpreter {implementation} pinned, {sys.implementation.name} here")
    here = f"{sys.version_info.major}.{sys.version_info.minor}"
    if pin.get("python") and str(pin["python"]) != here:
        problems.append(f"python {pin['python']} pinned, {here} here ({sys.executable})")
    # A package not pinned at preview time (None: the preview warned) is not checked.
    pinned = {name: wanted for name, wanted in (pin.get("packages") or {}).items() if wanted is not None}
    if not pinned:
        return problems
    # Only with packages to check: importlib.metadata (and the email package under it) is a third of the
    # runner's imports, paid by every member start.
    from importlib.metadata import PackageNotFoundError, version

    for name, wanted in sorted(pinned.items()):
        try:
            found = version(name)
        except PackageNotFoundError:
            problems.append(f"{name} {wanted} pinned, not installed here")
            continue
        if found != wanted:
            problems.append(f"{name} {wanted} pinned, {found} here")
    return problems


def usable_container_runtimes() -> list[str]:
    """The names of the container runtimes whose `info` answers with TunePlane's settings (the node's
    capability, reported with its capacity)."""
    import shutil  # here: only image pins need it, and shutil is 1-2 ms of every runner's start

    found = []
    for name in CONTAINER_RUNTIMES:
        binary = shutil.which(name)
        if binary is not None and _info(binary)[0]:
            found.append(name)
    return found


def _info(binary: str) -> tuple[bool, str]:
    try:
        done = subprocess.run(
            [binary, *global_options(binary), "info"],
            capture_output=True,
            text=True,
            timeout=20,
            check=False,
            env=runtime_env(),
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return False, str(exc)
    if done.returncode == 0:
        return True, ""
    last = (done.stderr or done.stdout).strip().splitlines()
    return False, f"info exited {done.returncode}" + (f" ({last[-1][:160]})" if last else "")


def usable_container_runtime() -> tuple[str | None, str]:
    """(runtime binary, what was tried): the first of podman/docker whose `info` answers."""
    import shutil

    tried = []
    for name in CONTAINER_RUNTIMES:
        binary = shutil.which(name)
        if binary is None:
            continue
        ok, why = _info(binary)
        if ok:
            return binary, ""
        tried.append(f"{name}: {why}")
    return None, "; ".join(tried) if tried else "neither podman nor docker is installed"


def environment_problems(pin: dict, member: dict | None) -> list[str]:
    """What differs between the member's built environment and the lock the preview pinned."""
    built = (member or {}).get("environment") or {}
    if not built.get("path"):
        return ["the job's environment was not prepared on this node (member.json names none)"]
    try:
        verify_environment(Path(built["path"]), pin["environment"], ready=True)
    except EnvironmentMismatch as exc:
        return [str(exc)]
    return []


def check_runtime(pin: dict, member: dict | None = None) -> str | None:
    """The container runtime to use (image pins) or None (Python pins); raises RuntimeRefused."""
    kind = pin.get("kind")
    if kind == "python" and pin.get("environment") and member is not None:
        problems = environment_problems(pin, member)
        if problems:
            raise RuntimeRefused("the job's environment does not match its lock: " + "; ".join(problems))
    if kind == "python" and (pin.get("environment") or {}).get("base") == "isolated":
        return None  # the environment's own interpreter runs the member (checked above by the runner)
    if kind == "python":
        problems = python_pin_problems(pin)
        if problems:
            raise RuntimeRefused(
                "the pinned Python runtime is not what this node has: " + "; ".join(problems)
            )
        return None
    if kind == "image":
        runtime, tried = usable_container_runtime()
        if runtime is None:
            raise RuntimeRefused(
                f"image {pin.get('image')} needs a container runtime and this node has no usable one "
                f"({tried}); an image's job is never run on the host"
            )
        return runtime
    raise RuntimeRefused(f"unknown runtime pin kind {kind!r}")
