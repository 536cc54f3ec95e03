"""What a prepared member directory holds, shared by the node agent's PREPARE (workers/agent/prepare.py) and
the Slurm job step (workers/slurm/step.py): the fields member.json carries, the source archive unpacked into
src/, and the failure a prepare step reports. Its own module so that the Slurm step imports neither aiohttp
nor the agent (a member's start is as cheap as its interpreter, ADR 0165).
"""

from __future__ import annotations

import os
import shutil
import tarfile
from pathlib import Path

# What member.json carries over from PREPARE's payload (the rest of the runner's input is the capsule).
MEMBER_FIELDS = (
    "member_id",
    "attempt_id",
    "attempt",
    "job_id",
    "rank",
    "world_size",
    "gpu_indices",
    "cpus",
    "memory_bytes",
    "capsule_digest",
    "master_addr",
    "master_port",
    "shared_path",
    "resume",
    "checkpoint_numbers",
)


class PrepareFailed(Exception):
    """A prepare step failed; the message is the reason reported with member_prepare_failed."""


def unpack_source(spec: dict, directory: Path) -> None:
    """The source archive into <member>/src (once); tarfile's data filter refuses what leaves the tree."""
    if (spec.get("input") or {}).get("kind") != "source":
        return
    src = directory / "src"
    if (src / ".tuneplane-unpacked").is_file():
        return
    if src.exists():
        shutil.rmtree(src)
    partial = directory / "src.partial"
    if partial.exists():
        shutil.rmtree(partial)
    partial.mkdir()
    try:
        with tarfile.open(directory / "capsule" / "source" / "archive.tar.gz", "r:gz") as tar:
            tar.extractall(partial, filter="data")
    except (tarfile.TarError, OSError) as exc:
        raise PrepareFailed(f"cannot unpack the source archive: {exc}") from exc
    (partial / ".tuneplane-unpacked").write_text("")
    os.replace(partial, src)
