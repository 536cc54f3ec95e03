"""The agent's environment builds: a deliberately slow uv never holds the event loop (heartbeats run on
it), concurrent prepares of one digest build it once, and the LRU clean-up keeps what live members use."""

from __future__ import annotations

import asyncio
import json
import os
import time
from pathlib import Path

import pytest

from tuneplane.app.submission.environments import EnvironmentSpec, resolve_environment
from tuneplane.app.uvtool import uv_binary
from tuneplane.workers.agent.disk_cleanup import CacheEntry, clean_up, environment_entries
from tuneplane.workers.agent.environments import EnvironmentBuildFailed, ensure_environment
from tuneplane.workers.runner.environment_check import READY_MARKER, EnvironmentMismatch, verify_environment


@pytest.fixture(scope="module")
def six_pin() -> dict:
    pin, _ = resolve_environment(EnvironmentSpec(packages=["six==1.16.0"]))
    assert pin is not None
    return pin


def slow_uv(tmp_path: Path, seconds: float) -> Path:
    """A stand-in for uv's binary that sleeps before `pip install`, then runs the real uv (test-only)."""
    wrapper = tmp_path / "slow-uv"
    wrapper.write_text(f'#!/bin/sh\nif [ "$1" = pip ]; then sleep {seconds}; fi\nexec {uv_binary()} "$@"\n')
    wrapper.chmod(0o755)
    return wrapper


def test_slow_build_never_delays_the_event_loop_and_runs_once_per_digest(
    tmp_path: Path, six_pin: dict, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TUNEPLANE_UV_BINARY", str(slow_uv(tmp_path, 3)))
    monkeypatch.setenv("UV_CACHE_DIR", str(tmp_path / "uv-cache"))  # cold: six is really downloaded
    steps: list[str] = []
    details: list[dict] = []

    async def progress(step: str, detail: dict) -> None:
        steps.append(step)
        details.append(detail)

    async def main() -> tuple[list, float]:
        loop = asyncio.get_running_loop()
        worst = 0.0
        done = asyncio.Event()

        async def heartbeat() -> None:  # what the agent's heartbeat task does: wake up on time
            nonlocal worst
            while not done.is_set():
                before = loop.time()
                await asyncio.sleep(0.05)
                worst = max(worst, loop.time() - before - 0.05)

        beat = loop.create_task(heartbeat())
        work = tmp_path / "work"
        built = await asyncio.gather(*(ensure_environment(work, six_pin, progress) for _ in range(3)))
        done.set()
        await beat
        return built, worst

    started = time.monotonic()
    built, worst = asyncio.run(main())
    assert time.monotonic() - started >= 3, "the stand-in must really be slow"
    assert worst < 1.0, f"the event loop was held {worst:.2f} s during a build"
    assert sorted(b.reused for b in built) == [False, True, True]  # one build, two waited and reused it
    assert steps.count("built") == 1 and steps.count("reused") == 2
    downloading = [d for s, d in zip(steps, details, strict=True) if s == "downloading"]
    assert downloading and downloading[-1]["downloaded"] == 1 and downloading[-1]["total"] == 1, details
    assert "downloading 1 of 1 packages" in downloading[-1]["message"]
    env = built[0].path
    verify_environment(env, six_pin, ready=True)
    assert json.loads((env / READY_MARKER).read_text())["digest"] == six_pin["digest"]
    assert [p.name for p in env.parent.iterdir() if ".build-" in p.name] == []


def test_failed_build_leaves_nothing_and_says_why(tmp_path: Path, six_pin: dict) -> None:
    pin = {**six_pin, "python": "3.9", "digest": "0" * 64}

    async def progress(step: str, detail: dict) -> None:
        return None

    with pytest.raises(EnvironmentBuildFailed, match=r"3\.9"):
        asyncio.run(ensure_environment(tmp_path, pin, progress))
    assert [p.name for p in (tmp_path / "environments").iterdir() if not p.name.endswith(".lock")] == []


def test_verify_names_a_package_that_differs_from_the_lock(tmp_path: Path, six_pin: dict) -> None:
    async def progress(step: str, detail: dict) -> None:
        return None

    env = asyncio.run(ensure_environment(tmp_path, six_pin, progress)).path
    with pytest.raises(EnvironmentMismatch, match=r"six 1\.15\.0 locked, 1\.16\.0 installed"):
        verify_environment(env, {**six_pin, "packages": {"six": "1.15.0"}})
    with pytest.raises(EnvironmentMismatch, match="built for"):
        verify_environment(env, {**six_pin, "digest": "1" * 64}, ready=True)


def _fake_env(root: Path, key: str, size: int, used_at: float) -> None:
    path = root / "environments" / key
    path.mkdir(parents=True)
    (path / "blob").write_bytes(b"x" * size)
    (path / READY_MARKER).write_text("{}")
    os.utime(path / READY_MARKER, (used_at, used_at))


def test_lru_clean_up_removes_least_recently_used_not_in_use(tmp_path: Path) -> None:
    now = time.time()
    for index, key in enumerate(("a" * 64, "b" * 64, "c" * 64, "d" * 64)):
        _fake_env(tmp_path, key, 1000, now - 1000 + index)  # a is the oldest, d the newest
    removed = clean_up(environment_entries(tmp_path), in_use={"a" * 64}, max_bytes=2500)
    # a is in use (kept although oldest); b and c go; the rest fits.
    assert sorted(e.key[0] for e in removed) == ["b", "c"]
    assert sorted(p.name[0] for p in (tmp_path / "environments").iterdir() if p.is_dir()) == ["a", "d"]


def test_capsules_younger_than_min_age_are_kept(tmp_path: Path) -> None:
    old, new = tmp_path / "old.tar", tmp_path / "new.tar"
    for path in (old, new):
        path.write_bytes(b"x" * 100)
    entries = [CacheEntry(old, "old", 100, time.time() - 3600), CacheEntry(new, "new", 100, time.time())]
    removed = clean_up(entries, set(), max_bytes=0, min_age=600)
    assert [e.key for e in removed] == ["old"] and new.exists() and not old.exists()
