from __future__ import annotations

from pathlib import Path

import pytest

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
