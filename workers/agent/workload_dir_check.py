"""The agent's start-up check of the directories workloads need on every node, object delivery or not:
member workspaces and outputs (`<work-dir>/members`) and the capsule/input cache (`<work-dir>/capsules`).

The agent refuses to start when either is not writable, and reports the result (with free space) as a
node event on every control session, so an operator sees it on the Fleet page's event list.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
from pathlib import Path

from tuneplane.workers.agent.directories import AgentPaths, StateError
from tuneplane.workers.agent.handlers import SESSION_HOOKS, AgentContext

# (label, directory under the work directory)
WORKLOAD_DIRS = (("outputs", "members"), ("cache", "capsules"))


def check_dir(path: Path) -> dict:
    """Create, write, fsync, read back and remove a probe file; free space of the filesystem."""
    result: dict = {"path": str(path)}
    probe = path / f".tuneplane-probe-{secrets.token_hex(4)}"
    payload = secrets.token_bytes(32)
    try:
        path.mkdir(parents=True, exist_ok=True)
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.write(fd, payload)
            os.fsync(fd)
        finally:
            os.close(fd)
        if probe.read_bytes() != payload:
            return {**result, "ok": False, "error": "read back other bytes than written"}
        result["free_bytes"] = shutil.disk_usage(path).free
        return {**result, "ok": True}
    except OSError as exc:
        return {**result, "ok": False, "error": exc.strerror or str(exc)}
    finally:
        with contextlib.suppress(OSError):
            probe.unlink(missing_ok=True)


def check_workload_dirs(paths: AgentPaths) -> dict:
    """{label: check}; raises StateError naming every directory that cannot be written."""
    checks = {label: check_dir(paths.work_dir / sub) for label, sub in WORKLOAD_DIRS}
    bad = [f"{c['path']} ({label}): {c['error']}" for label, c in checks.items() if not c["ok"]]
    if bad:
        raise StateError("workload directories are not writable: " + "; ".join(bad))
    return checks


def _describe(checks: dict) -> str:
    parts = [
        f"{label} {c['path']} writable, {c['free_bytes'] / 1024**3:.1f} GiB free"
        for label, c in checks.items()
    ]
    return "work directories checked: " + "; ".join(parts)


async def report_workload_dirs(ctx: AgentContext) -> None:
    checks = ctx.extra.get("workload_dirs")
    if checks and ctx.report is not None:
        await ctx.report("note", {"message": _describe(checks), "workload_dirs": checks})


SESSION_HOOKS.append(report_workload_dirs)
