from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from tuneplane.workers.agent.directories import AgentPaths, StateError
from tuneplane.workers.agent.disk_cleanup import PARTIAL_STALE_AFTER, clean_caches
from tuneplane.workers.agent.workload_dir_check import check_workload_dirs


def test_writable_work_dirs_are_checked_with_free_space(tmp_path: Path) -> None:
    paths = AgentPaths.prepare(tmp_path / "state", tmp_path / "work")
    checks = check_workload_dirs(paths)
    assert set(checks) == {"outputs", "cache"}
    assert all(c["ok"] and c["free_bytes"] > 0 for c in checks.values())
    assert not list((tmp_path / "work" / "members").glob(".tuneplane-probe-*"))  # the probe is removed


def test_an_unwritable_work_dir_stops_the_agent_naming_it(tmp_path: Path) -> None:
    paths = AgentPaths.prepare(tmp_path / "state", tmp_path / "work")
    (tmp_path / "work" / "capsules").write_text("a file where the cache directory should be")
    with pytest.raises(StateError, match=r"capsules \(cache\)"):
        check_workload_dirs(paths)


def test_a_capsule_download_left_by_a_killed_agent_is_removed_once_stale_a_live_one_is_kept(
    tmp_path: Path,
) -> None:
    capsules = tmp_path / "capsules"
    capsules.mkdir()
    orphan = capsules / f"{'a' * 64}.4242.1.partial"  # its agent was killed -9 mid-fetch
    orphan.write_bytes(b"x" * 1024)
    old = time.time() - PARTIAL_STALE_AFTER - 60
    os.utime(orphan, (old, old))
    live = capsules / f"{'b' * 64}.{os.getpid()}.2.partial"  # a fetch appending right now
    live.write_bytes(b"y")
    removed = clean_caches(tmp_path, [])
    assert removed["partials"] == [orphan.name]
    assert not orphan.exists() and live.exists()


def test_finished_members_directories_go_after_the_keep_time_never_a_needed_or_live_one(
    tmp_path: Path,
) -> None:
    import subprocess
    import sys

    from tuneplane.workers.agent.disk_cleanup import remove_finished_member_dirs
    from tuneplane.workers.agent.member_records import MemberRecord, member_tag_in
    from tuneplane.workers.proctree import TAG_VARIABLE, tagged

    def workspace(member_id: int, age: float) -> Path:
        path = tmp_path / "members" / str(member_id)
        (path / "output" / "ckpt").mkdir(parents=True)
        (path / "output" / "ckpt" / "w.bin").write_bytes(b"w" * 1024)
        when = time.time() - age
        for each in (path / "output" / "ckpt" / "w.bin", path / "output" / "ckpt", path / "output", path):
            os.utime(each, (when, when))
        return path

    day = 24 * 3600.0

    def record(member_id: int, **fields: object) -> MemberRecord:
        return MemberRecord(member_id=member_id, attempt_id=1, job_id=1, attempt=1, rank=0, **fields)

    done = workspace(1, 2 * day)  # ended, reported, delivered: the agent forgot it
    recent = workspace(2, 60)  # done too, but touched a minute ago
    delivering = workspace(3, 2 * day)
    unreported = workspace(4, 2 * day)
    running = workspace(5, 2 * day)
    live = workspace(6, 2 * day)  # no record (a state disk lost), but its process still runs
    records = [
        record(2, state="ended"),
        record(3, state="ended", deliveries={"ckpt": {"state": "pending"}}),
        record(4, state="ended", unreported={"member_exited": {}}),
        record(5, state="running"),
    ]
    process = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(60)"],
        env={**os.environ, TAG_VARIABLE: member_tag_in(tmp_path, 6)},
    )
    try:
        assert tagged(member_tag_in(tmp_path, 6)) == {process.pid}
        removed = remove_finished_member_dirs(tmp_path, records, keep_for=day)
    finally:
        process.kill()
        process.wait()
    assert removed == [1] and not done.exists()
    assert all(p.exists() for p in (recent, delivering, unreported, running, live))
    assert not list((tmp_path / "members").glob(".delete-*"))


def _leftover(tmp_path: Path, name: str, size: int = 4096) -> Path:
    path = tmp_path / "environments" / name
    (path / "lib").mkdir(parents=True)
    (path / "lib" / "big.so").write_bytes(b"\0" * size)
    return path


def test_a_build_left_by_a_killed_agent_is_counted_then_removed_by_the_next_clean_up(tmp_path: Path) -> None:
    from tuneplane.workers.agent.disk_cleanup import cache_sizes

    abandoned = _leftover(tmp_path, f"{'a' * 64}.build-4242424-0", 1 << 20)  # its build's lock is free
    sizes = cache_sizes(tmp_path)["environments"]
    assert sizes["unfinished"] == 1 and sizes["bytes"] >= 1 << 20  # the disk it takes is the cache's
    assert clean_caches(tmp_path, [])["abandoned_builds"] == [abandoned.name]
    assert not abandoned.exists()
    assert cache_sizes(tmp_path)["environments"] == {"count": 0, "bytes": 0, "unfinished": 0}


def test_a_running_build_and_a_running_removal_are_kept(tmp_path: Path) -> None:
    import fcntl

    building = _leftover(tmp_path, f"{'b' * 64}.build-{os.getpid()}-0")
    removing = _leftover(tmp_path, f"{'c' * 64}.delete-{os.getpid()}-1")  # its process (this one) lives
    fd = os.open(tmp_path / "environments" / f"{'b' * 64}.lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # what ensure_environment holds for the whole build
        assert clean_caches(tmp_path, [])["abandoned_builds"] == []
        assert building.exists() and removing.exists()
    finally:
        os.close(fd)
    assert clean_caches(tmp_path, [])["abandoned_builds"] == [building.name]  # its lock is free now
    assert removing.exists()


def test_a_burst_of_prepares_gets_one_clean_up_after_the_delay_with_the_records_of_then(
    tmp_path: Path,
) -> None:
    """Issue 23: the clean-up and its node_caches report wait until the launch settled; prepares done while
    one waits are covered by it (it reads the member records when it wakes)."""
    import asyncio

    from tuneplane.workers.agent.disk_cleanup import schedule_clean_caches
    from tuneplane.workers.agent.member_records import MemberRecord

    sent: list[tuple[float, str]] = []
    records: list = []
    asked: list[int] = []

    def current() -> list:
        asked.append(len(records))
        return records

    async def send(kind: str, _sizes: dict) -> None:
        sent.append((time.monotonic(), kind))

    async def burst() -> float:
        start = time.monotonic()
        for _ in range(8):
            schedule_clean_caches(tmp_path, current, send, delay=0.3)
            records.append(MemberRecord(len(records) + 1, 1, 1, 1, len(records), state="prepared"))
        for _ in range(100):
            if sent:
                break
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.1)  # room for a second (wrong) clean-up to show up
        return start

    start = asyncio.run(burst())
    assert [kind for _, kind in sent] == ["node_caches"]
    assert sent[0][0] - start >= 0.3
    assert asked == [8]  # the records of when it woke, not of the first prepare
