from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from workers.agent.environments import PARTIAL_STALE_AFTER, clean_caches
from workers.agent.state import AgentPaths, StateError
from workers.agent.workdirs import check_workload_dirs


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
