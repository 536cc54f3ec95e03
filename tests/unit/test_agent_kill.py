"""The agent acknowledges KILL only when no process of the member is left, whatever its record says
(issue 24): the acknowledgement is what releases the member's GPUs and lets its job be retried elsewhere.

Real processes: a `keeper` named in the member directory's runner.json (as the runner writes it) whose
child was started with a clean environment (`env -i`: it carries no member tag), the case the tag alone
misses. Before, a member whose record was not `running` (none, `ended`, `preparing`) was KILLed by tag
only and acknowledged at once: the keeper and its child ran on after the acknowledgement.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import pytest

from tuneplane.workers.agent.directories import AgentPaths
from tuneplane.workers.agent.handlers import AgentContext
from tuneplane.workers.agent.launch import LaunchAgent
from tuneplane.workers.agent.member_records import MemberRecord, member_dir
from tuneplane.workers.proctree import alive, descendants, start_time
from tuneplane.workers.runner.process import PIDS_FILE

MEMBER = 7


def _keeper_with_untagged_child(directory: Path) -> subprocess.Popen:
    """A stand-in keeper (sleeps) that starts a child with an empty environment, recorded in runner.json."""
    keeper = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import subprocess,time; subprocess.Popen(['env','-i','sleep','300']); time.sleep(300)",
        ],
        start_new_session=True,
    )
    for _ in range(100):
        if descendants(keeper.pid):
            break
        subprocess.run(["sleep", "0.05"], check=True)
    assert descendants(keeper.pid), "the keeper's child did not start"
    directory.mkdir(parents=True, exist_ok=True)
    (directory / PIDS_FILE).write_text(
        json.dumps({"runner": None, "keeper": keeper.pid, "keeper_started": start_time(keeper.pid)})
    )
    return keeper


@pytest.mark.parametrize("record_state", [None, "ended", "preparing", "failed"])
def test_kill_is_acknowledged_only_once_no_process_of_the_member_is_left(
    tmp_path: Path, record_state: str | None
) -> None:
    ctx = AgentContext(paths=AgentPaths.prepare(tmp_path / "state"))
    agent = LaunchAgent(ctx)
    keeper = _keeper_with_untagged_child(member_dir(ctx.paths, MEMBER))
    child = next(iter(descendants(keeper.pid)))
    if record_state is not None:
        agent.store.save(MemberRecord(MEMBER, 1, 1, 1, 0, state=record_state, reason="whatever it says"))
    try:
        answer = asyncio.run(agent.kill([MEMBER], "fenced"))
        # The answer (the acknowledgement the agent sends) comes only once nothing of the member is left.
        assert not alive(child), "the keeper's untagged child outlived the KILL's acknowledgement"
        assert not alive(keeper.pid) or keeper.poll() is not None
        assert answer == {"killed": {str(MEMBER): "2 process(es) killed"}}
    finally:
        keeper.kill()
        keeper.wait(5)
        subprocess.run(["kill", "-9", str(child)], capture_output=True)
