from __future__ import annotations

import sys
import threading
from pathlib import Path

from app.supervisor import Component, Supervisor
from tests.helpers import wait_for


def test_a_dying_child_is_reported_restarted_then_everything_stops(tmp_path: Path) -> None:
    reports: list[str] = []
    sup = Supervisor(tmp_path / "logs", reports.append, max_restarts=2, restart_window=60, grace=5)
    sup.start(Component("sleeper", [sys.executable, "-c", "import time; time.sleep(60)"]))
    sup.start(Component("crasher", [sys.executable, "-c", "print('boom'); raise SystemExit(3)"]))
    sleeper = sup.running[0].process
    assert sup.watch() == 1
    died = [r for r in reports if r.startswith("crasher exited with status 3")]
    assert len(died) == 3 and str(tmp_path / "logs" / "crasher.log") in died[0]
    assert any("failed 3 times" in r for r in reports)
    assert sleeper.poll() is not None  # the healthy component was stopped too
    assert "boom" in (tmp_path / "logs" / "crasher.log").read_text()


def test_stop_request_stops_children_in_reverse_order(tmp_path: Path) -> None:
    reports: list[str] = []
    sup = Supervisor(tmp_path / "logs", reports.append, grace=5)
    for name in ("first", "second"):
        sup.start(Component(name, [sys.executable, "-c", "import time; time.sleep(60)"]))
    result: list[int] = []
    thread = threading.Thread(target=lambda: result.append(sup.watch()))
    thread.start()
    sup.stop_requested.set()
    thread.join(30)
    assert result == [0]
    stops = [r for r in reports if r.startswith("stopped ")]
    assert stops == ["stopped second", "stopped first"]


def test_child_ignoring_sigterm_is_killed_after_grace(tmp_path: Path) -> None:
    reports: list[str] = []
    sup = Supervisor(tmp_path / "logs", reports.append, grace=0.5)
    code = (
        "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
        "print('ready', flush=True); time.sleep(60)"
    )
    sup.start(Component("stubborn", [sys.executable, "-c", code]))
    log = tmp_path / "logs" / "stubborn.log"
    wait_for(
        lambda: log.exists() and "ready" in log.read_text(), timeout=20, what="child to install its handler"
    )
    process = sup.running[0].process
    sup.stop_all()
    assert process.poll() is not None
    assert any("ignored SIGTERM" in r for r in reports)
