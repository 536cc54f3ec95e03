"""The agent's member records: a launch record is written without an fsync (MemberStore.save), an end record
with one; either way a record written before the agent is killed is there for the agent started after it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.small_fs import fill_up, small_tmpfs
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


def test_a_launch_record_that_exists_is_rewritten_in_place_and_reads_back_whole(tmp_path: Path) -> None:
    """No temporary file and rename for a launch record that exists and fits a page (the rename waits for
    ext4's journal on a busy disk); a first record, a large one and an end record are still renamed."""
    directory = tmp_path / "members"
    store = MemberStore(directory)
    path = directory / "7.json"
    store.save(_record("preparing"), sync=False)
    created = path.stat().st_ino
    record = _record("running")
    record.unreported = {"member_started": {"member_id": 7, "pid": 4242}, "note": "x" * 500}
    store.save(record, sync=False)
    assert path.stat().st_ino == created
    record.unreported = {}  # shorter than what the file holds: the rest is padding JSON ignores
    store.save(record, sync=False)
    assert path.stat().st_ino == created
    found = MemberStore(directory).get(7)
    assert found is not None and found.state == "running" and found.unreported == {}

    record.unreported = {"note": "y" * 5000}  # more than a page: written whole and renamed
    store.save(record, sync=False)
    renamed = path.stat().st_ino
    assert renamed != created
    assert MemberStore(directory).get(7).unreported == {"note": "y" * 5000}

    record.unreported = {}
    record.state = "ended"
    store.save(record, sync=False)  # an end record: durable and whole, by a rename, whatever the caller says
    assert path.stat().st_ino != renamed
    assert MemberStore(directory).get(7).state == "ended"
    assert not list(directory.glob("*.tmp"))


def test_a_writer_killed_while_it_rewrites_a_record_in_place_leaves_a_whole_record(tmp_path: Path) -> None:
    """kill -9 at a random moment of a writer that rewrites one record in place as fast as it can, with
    lengths that grow and shrink: the agent started after it finds the old record or the new one, never a
    mix and never nothing."""
    writer = (
        "import sys\n"
        "from pathlib import Path\n"
        "from tuneplane.workers.agent.member_records import MemberRecord, MemberStore\n"
        "store = MemberStore(Path(sys.argv[1]))\n"
        "i = 0\n"
        "while True:\n"
        "    i += 1\n"
        "    store.save(MemberRecord(member_id=9, attempt_id=1, job_id=1, attempt=1, rank=0,\n"
        "                            state='running' if i % 2 else 'prepared', pid=i,\n"
        "                            unreported={'pad': 'z' * (i * 37 % 3000)}), sync=False)\n"
        "    if i == 1:  # the record exists: from here on every write is in place\n"
        "        sys.stdout.write('ready\\n'); sys.stdout.flush()\n"
    )
    directory = tmp_path / "members"
    seen_pids: set[int] = set()
    for delay in (0.0, 0.003, 0.007, 0.011, 0.02, 0.03, 0.05, 0.08):
        child = subprocess.Popen(
            [sys.executable, "-c", writer, str(directory)], stdout=subprocess.PIPE, text=True
        )
        assert child.stdout is not None and child.stdout.readline() == "ready\n"
        if delay:
            # Not a synchronisation: the moment of the kill is what varies between rounds.
            subprocess.run(["sleep", str(delay)], check=True)
        child.send_signal(signal.SIGKILL)
        assert child.wait(timeout=30) == -signal.SIGKILL
        found = MemberStore(directory).get(9)
        assert found is not None, "the record was lost or torn"
        assert found.state == ("running" if found.pid % 2 else "prepared")
        assert found.unreported == {"pad": "z" * (found.pid * 37 % 3000)}
        seen_pids.add(found.pid)
    assert len(seen_pids) > 1  # the writer was caught at different records


def test_on_a_full_disk_a_record_rewritten_in_place_is_written_and_a_new_one_is_refused_whole(
    tmp_path: Path,
) -> None:
    """An in-place rewrite needs no new space; a record written whole (a new one) meets ENOSPC and leaves
    neither a record nor a temporary file. (A real size-limited tmpfs; skipped where mounting needs root.)"""
    directory = tmp_path / "state"
    with small_tmpfs(directory, "1m"):
        store = MemberStore(directory / "members")
        store.save(_record("prepared"), sync=False)
        filler = fill_up(directory)
        try:
            store.save(_record("running"), sync=False)
            assert MemberStore(directory / "members").get(7).state == "running"
            other = _record("preparing")
            other.member_id = 8
            with pytest.raises(OSError):
                store.save(other, sync=False)
            assert sorted(p.name for p in (directory / "members").iterdir()) == ["7.json"]
        finally:
            filler.unlink()
