"""Retention of member directories on the node (`<work-dir>/members/<id>/`: capsule, source, inputs,
outputs, logs). Without it a long-lived node's disk only grows: every member ever run stays there.

A directory is removed by the cache clean-up once the agent is done with its member — the member ended,
its end was reported and acknowledged, its outputs and logs were delivered (or given up), or the agent
already forgot it — and nothing under it changed for `TUNEPLANE_MEMBER_DIR_KEEP` seconds (default one
day: its logs and outputs stay at hand for someone looking at the node). A directory whose member still
has a live process (found by the member's tag) is never removed, whatever the records say.
"""

from __future__ import annotations

import itertools
import os
import shutil
import time
from pathlib import Path

from tuneplane.workers.agent.members import MemberRecord, member_tag_in, settled
from tuneplane.workers.disk_usage import tree_usage
from tuneplane.workers.proctree import tagged

MEMBER_DIR_KEEP = float(os.environ.get("TUNEPLANE_MEMBER_DIR_KEEP", str(24 * 3600)))
_counter = itertools.count()


def remove_finished_member_dirs(
    work_dir: Path, records: list[MemberRecord], keep_for: float = MEMBER_DIR_KEEP
) -> list[int]:
    """Remove the directories of members the agent is done with and that have not changed for `keep_for`
    seconds. Returns the member ids removed."""
    needed = {r.member_id for r in records if not settled(r)}
    horizon = time.time() - keep_for
    removed = []
    root = work_dir / "members"
    for path in sorted(root.iterdir()) if root.is_dir() else []:
        if not path.name.isdigit() or not path.is_dir() or int(path.name) in needed:
            continue
        member_id = int(path.name)
        try:
            if tree_usage(path).newest > horizon:
                continue
        except OSError:
            continue
        if tagged(member_tag_in(work_dir, member_id)):
            continue  # a process of it still runs (a record lost with a disk, say): keep its workspace
        # Renamed first, so a half-removed directory never looks like a member's workspace.
        doomed = path.with_name(f".delete-{path.name}-{os.getpid()}-{next(_counter)}")
        try:
            os.rename(path, doomed)
        except OSError:
            continue
        shutil.rmtree(doomed, ignore_errors=True)
        removed.append(member_id)
    return removed
