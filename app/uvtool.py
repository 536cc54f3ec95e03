"""uv as TunePlane calls it, on the server (resolution at preview) and on nodes (builds): the binary, its
process environment and its reasons as one line (docs/runtimes.md, ADR 0120)."""

from __future__ import annotations

import os
import subprocess


def uv_binary() -> str:
    """uv from the `uv` package (its wheel ships the binary), or TUNEPLANE_UV_BINARY."""
    from uv import find_uv_bin

    return os.environ.get("TUNEPLANE_UV_BINARY") or find_uv_bin()


def uv_environment() -> dict[str, str]:
    """uv's process environment: never a managed Python download (only the index is reachable), no user
    configuration file, the system's CA store (a proxy's CA is trusted as pip trusts it), no TUNEPLANE_*
    secret, no VIRTUAL_ENV of the caller."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TUNEPLANE_") and k != "VIRTUAL_ENV"}
    env.update(UV_PYTHON_DOWNLOADS="never", UV_NO_CONFIG="1", UV_SYSTEM_CERTS="1", NO_COLOR="1")
    return env


def uv_version(binary: str | None = None) -> str:
    done = subprocess.run([binary or uv_binary(), "--version"], capture_output=True, text=True, check=False)
    return done.stdout.strip().removeprefix("uv ").split(" ")[0]


def uv_reason(output: str, limit: int = 2000) -> str:
    """uv's explanation without its box-drawing decoration and hints, on one line."""
    lines = [line.strip().lstrip("×╰─▶│├ ").strip() for line in output.splitlines()]
    kept = [
        line
        for line in lines
        if line and not line.startswith(("hint:", "warning:", "Using ", "DEBUG ", "TRACE "))
    ]
    return " ".join(kept)[-limit:] or "uv gave no reason"
