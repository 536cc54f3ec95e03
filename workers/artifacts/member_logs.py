"""A member's stdout and stderr as an artifact of its attempt (kind `logs`, name `logs`).

When a member ends (whatever its exit status) the agent plans this delivery next to the spec's outputs
(workers.agent.delivery); it goes through the same durable, retried upload. The files are copied once into
`<member dir>/artifacts/logs/` so the artifact is a directory that no longer changes (a retry after a
crash builds the same manifest and resumes the same upload), holding `stdout.log` and `stderr.log`.
"""

from __future__ import annotations

import shutil
from pathlib import Path

LOGS_ARTIFACT = "logs"
LOG_FILES = ("stdout.log", "stderr.log")


def logs_output() -> dict:
    """The delivery entry for a member's logs, in the shape of a spec output (plus its kind)."""
    return {"name": LOGS_ARTIFACT, "path": "", "kind": "logs"}


def snapshot_logs(member_directory: Path) -> Path:
    """The directory to deliver: a copy of the member's stdout/stderr (a missing one as an empty file)."""
    target = member_directory / "artifacts" / LOGS_ARTIFACT
    target.mkdir(parents=True, exist_ok=True)
    for name in LOG_FILES:
        source = member_directory / "logs" / name
        copy = target / name
        if not source.is_file():
            copy.touch()
        elif not copy.is_file() or copy.stat().st_size != source.stat().st_size:
            tmp = copy.with_suffix(".partial")
            shutil.copyfile(source, tmp)
            tmp.replace(copy)
    return target
