"""Standby runners (workers/runner/standby.py, ADR 0240): a real runner process started before its member,
handed the member over its stdin, gated on the agent's go; and the agent's pool of them."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import time
from pathlib import Path

import pytest

from tests.helpers import wait_for
from tests.unit.test_capsule_and_runner import _prepared_member, built  # noqa: F401 - the fixture
from tuneplane.workers.agent import standby_runners
from tuneplane.workers.agent.standby_runners import StandbyRunners
from tuneplane.workers.runner import standby_command
from tuneplane.workers.runner.process import member_lock_held
from tuneplane.workers.runner.standby import wait_for_go

PRINT_ENV = 'echo "order=${ORDER_ONLY:-none} standby=${STANDBY_ONLY:-none}"'


def _standby(**extra: str) -> subprocess.Popen:
    return subprocess.Popen(
        standby_command(),
        env={**os.environ, "STANDBY_ONLY": "from-the-spawn", **extra},
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )


def _order(root: Path, **env: str) -> bytes:
    return json.dumps({"member_dir": str(root), "env": {**os.environ, **env}}).encode() + b"\n"


def test_a_handed_standby_holds_the_member_lock_and_starts_nothing_before_go(built, tmp_path: Path) -> None:  # noqa: F811
    root = _prepared_member(built, tmp_path, entrypoint=PRINT_ENV)
    child = _standby()
    try:
        assert child.stdin is not None
        child.stdin.write(_order(root, ORDER_ONLY="from-the-order"))
        child.stdin.flush()
        # The lock at once: an agent restarted now adopts this run instead of starting another.
        wait_for(lambda: member_lock_held(root), timeout=30, what="the standby to take the member's lock")
        time.sleep(0.5)  # within the gate: nothing of the member may have started or been written
        assert child.poll() is None
        assert not (root / "exit_status.json").exists() and not (root / "logs" / "stdout.log").exists()

        child.stdin.write(b"go\n")
        child.stdin.close()
        assert child.wait(60) == 0, child.stderr.read() if child.stderr else ""
    finally:
        child.kill()
        child.wait()
    status = json.loads((root / "exit_status.json").read_text())
    assert status["exit_code"] == 0, status
    # Its environment is the order's, not the one it was spawned with; its output goes to runner.log.
    assert (root / "logs" / "stdout.log").read_text().strip() == "order=from-the-order standby=none"
    runner_log = (root / "logs" / "runner.log").read_text()
    assert "starting member 1 rank 0" in runner_log and "go did not come" not in runner_log


def test_a_standby_whose_agent_is_gone_after_the_order_starts_its_member(built, tmp_path: Path) -> None:  # noqa: F811
    root = _prepared_member(built, tmp_path, exit_code=4)
    child = _standby()
    assert child.stdin is not None
    child.stdin.write(_order(root))
    child.stdin.close()  # the agent died after the order: its committed member must not be held back
    assert child.wait(60) == 0
    assert json.loads((root / "exit_status.json").read_text())["exit_code"] == 4
    assert (
        "the agent's go did not come (agent gone); starting the member"
        in (root / "logs" / "runner.log").read_text()
    )


def test_a_standby_without_an_order_exits_quietly_and_a_bad_order_is_refused_by_field(
    built,  # noqa: F811
    tmp_path: Path,
) -> None:
    child = _standby()
    out, err = child.communicate(b"", timeout=60)
    assert (child.returncode, out, err) == (0, b"", b"")

    root = _prepared_member(built, tmp_path)
    for order, field in (
        (b"not json\n", "not JSON"),
        (json.dumps({"member_dir": str(tmp_path / "missing"), "env": {}}).encode() + b"\n", "member_dir"),
        (json.dumps({"member_dir": str(root), "env": {"A": 1}}).encode() + b"\n", "env"),
        (b"[1]\n", "not an object"),
    ):
        child = _standby()
        _out, err = child.communicate(order, timeout=60)
        assert child.returncode == 2, err
        assert b"refused the agent's order" in err and field.encode() in err and b"Traceback" not in err
    # Nothing of the member was touched.
    assert not member_lock_held(root) and not (root / "exit_status.json").exists()
    assert not (root / "logs").exists()


def test_the_gate_opens_on_go_on_the_end_of_the_stream_or_after_its_timeout() -> None:
    assert wait_for_go(-1, b"go\n", timeout=0) == "go"  # the go came with the order
    read, write = os.pipe()
    try:
        started = time.monotonic()
        assert wait_for_go(read, b"", timeout=0.3) == "timed out"
        assert time.monotonic() - started >= 0.3
        os.write(write, b"g")
        os.write(write, b"o\n")
        assert wait_for_go(read, b"", timeout=30) == "go"
        os.close(write)
        write = -1
        assert wait_for_go(read, b"", timeout=30) == "agent gone"
    finally:
        os.close(read)
        if write >= 0:
            os.close(write)


def test_the_pool_hands_a_ready_standby_skips_a_dead_one_and_refills_later(
    built,  # noqa: F811
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(standby_runners, "REFILL_DELAY", 0.2)
    roots = []
    for name in ("one", "two"):
        (tmp_path / name).mkdir()
        roots.append(_prepared_member(built, tmp_path / name))
    said: list[str] = []
    pool = StandbyRunners(1, lambda: dict(os.environ), tmp_path, said.append)

    async def scenario() -> None:
        pool.fill()
        (ready,) = pool.ready
        handed = pool.hand(roots[0], dict(os.environ))
        assert handed is ready and pool.ready == []
        pool.go(handed)
        assert await asyncio.to_thread(handed.wait, 60) == 0
        # Refilled REFILL_DELAY later, not at once (its start would compete with the members starting).
        await asyncio.sleep(0.6)
        (second,) = pool.ready
        assert second.pid != ready.pid
        second.kill()
        second.wait()
        # A standby that died is never handed a member: one is started for it instead.
        handed = pool.hand(roots[1], dict(os.environ))
        assert handed is not None and handed.pid != second.pid
        pool.go(handed)
        assert await asyncio.to_thread(handed.wait, 60) == 0

    try:
        asyncio.run(scenario())
    finally:
        pool.close()
    for root in roots:
        assert json.loads((root / "exit_status.json").read_text())["exit_code"] == 0
    assert said == []
    assert pool.ready == [] and pool.closed
