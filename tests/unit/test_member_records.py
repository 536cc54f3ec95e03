"""The agent's member records: a launch record is written without an fsync (MemberStore.save), an end record
with one; either way a record written before the agent is killed is there for the agent started after it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tuneplane.workers.agent.member_records import MemberRecord, MemberStore


def _record(state: str) -> MemberRecord:
    return MemberRecord(member_id=7, attempt_id=3, job_id=2, attempt=1, rank=0, state=state, pid=4242)


def test_a_launch_record_skips_the_fsync_and_an_end_record_does_not(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    synced: list[int] = []
    real_fsync = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (synced.append(fd), real_fsync(fd)))
    store = MemberStore(tmp_path / "members")

    store.save(_record("running"), sync=False)
    assert synced == []
    assert MemberStore(tmp_path / "members").get(7).state == "running"
    assert not list((tmp_path / "members").glob("*.tmp"))  # still written whole, by a rename

    record = _record("ended")
    record.exit_code = 0
    assert store.keep(record) is None
    assert len(synced) == 1
    assert MemberStore(tmp_path / "members").get(7).exit_code == 0

    # A later write of an ended member (the pid of a collector a drain spawned) is made durable whatever
    # its caller asks: it replaces the end record.
    record.collector_pid = 4343
    store.save(record, sync=False)
    assert len(synced) == 2
    assert MemberStore(tmp_path / "members").get(7).collector_pid == 4343


def test_a_launch_record_outlives_a_kill_9_of_the_agent_that_wrote_it(tmp_path: Path) -> None:
    """What the launch records guard against is the agent's own end: the page cache outlives it."""
    writer = (
        "import os, signal, sys\n"
        "from pathlib import Path\n"
        "from tuneplane.workers.agent.member_records import MemberRecord, MemberStore\n"
        "store = MemberStore(Path(sys.argv[1]))\n"
        "store.save(MemberRecord(member_id=9, attempt_id=1, job_id=1, attempt=1, rank=0, state='running',\n"
        "                        pid=1234, unreported={'member_started': {'member_id': 9, 'pid': 1234}}),\n"
        "           sync=False)\n"
        "os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    done = subprocess.run([sys.executable, "-c", writer, str(tmp_path / "members")], timeout=60)
    assert done.returncode == -signal.SIGKILL
    found = MemberStore(tmp_path / "members").get(9)
    assert found is not None and found.state == "running" and found.pid == 1234
    assert found.unreported == {"member_started": {"member_id": 9, "pid": 1234}}
