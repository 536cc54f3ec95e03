"""Checking a built job environment against the lock the preview pinned (the agent after a build, the
runner again before it starts the member with that environment's interpreter)."""

from __future__ import annotations

import json
import re
from pathlib import Path

READY_MARKER = ".tuneplane-env.json"


class EnvironmentMismatch(Exception):
    """The environment is missing, not ready, or differs from its lock; the message says how."""


def normalise_name(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def interpreter_of(env: Path) -> Path:
    return env / "bin" / "python"


def installed_versions(env: Path) -> dict[str, str]:
    """{normalised name: version} of every distribution in the environment's own site-packages."""
    # Here, not at the top: the email package is 9 ms of a runner's start, and only a job with an
    # environment checks one.
    from email.parser import HeaderParser

    found: dict[str, str] = {}
    for metadata in env.glob("lib/python3*/site-packages/*.dist-info/METADATA"):
        try:
            headers = HeaderParser().parsestr(metadata.read_text(errors="replace"), headersonly=True)
        except OSError:
            continue
        if headers.get("Name") and headers.get("Version"):
            found[normalise_name(headers["Name"])] = headers["Version"]
    return found


def verify_environment(env: Path, pin: dict, *, ready: bool = False) -> None:
    """Raise EnvironmentMismatch unless every locked package is installed at its locked version (and, with
    ready=True, the ready marker names this digest)."""
    if ready:
        try:
            marker = json.loads((env / READY_MARKER).read_text())
        except (OSError, ValueError) as exc:
            raise EnvironmentMismatch(f"environment {env} is not ready ({exc})") from exc
        if marker.get("digest") != pin.get("digest"):
            raise EnvironmentMismatch(
                f"environment {env} was built for {marker.get('digest')}, not {pin.get('digest')}"
            )
    if not interpreter_of(env).exists():
        raise EnvironmentMismatch(f"environment {env} has no interpreter")
    installed = installed_versions(env)
    problems = []
    for name, wanted in sorted((pin.get("packages") or {}).items()):
        found = installed.get(normalise_name(name))
        if found is None:
            problems.append(f"{name} {wanted} locked, not installed")
        elif found != wanted:
            problems.append(f"{name} {wanted} locked, {found} installed")
    if problems:
        raise EnvironmentMismatch("; ".join(problems))
