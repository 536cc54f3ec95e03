from __future__ import annotations

import itertools
import os
import signal
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.helpers import wait_for
from tuneplane.app.supervisor import Component, ComponentFailed, Supervisor


def test_a_dying_child_is_restarted_with_growing_delays_then_everything_stops(tmp_path: Path) -> None:
    reports: list[str] = []
    sup = Supervisor(tmp_path / "logs", reports.append, max_restarts=3, backoff_base=0.2, grace=5)
    sup.start(Component("sleeper", [sys.executable, "-c", "import time; time.sleep(60)"]))
    crasher = (
        "import sys, time; print('boom: cannot reach the database at', time.time(), flush=True);"
        " raise SystemExit(3)"
    )
    sup.start(Component("crasher", [sys.executable, "-c", crasher]))
    sleeper = sup.running[0].process
    starts: list[float] = []
    real_spawn = sup._spawn

    def spawn(component: Component):  # times each start of the crasher (the supervisor's own clock)
        if component.name == "crasher":
            starts.append(time.monotonic())
        return real_spawn(component)

    sup._spawn = spawn  # type: ignore[method-assign]
    assert sup.watch() == 1
    died = [r for r in reports if r.startswith("crasher exited with status 3")]
    assert len(died) == 4
    # Each message says why: the exit status, the child's last log line, and where its log is.
    assert all("boom: cannot reach the database" in r for r in died)
    assert all(str(tmp_path / "logs" / "crasher.log") in r for r in died)
    assert [d.split("restarting in ")[1].split("s.")[0] for d in died[:3]] == ["0.2", "0.4", "0.8"]
    assert "failed 4 times in a row" in died[3] and "stopping TunePlane" in died[3]
    # The delays between restarts grow (the machine may be slow, so each is at least its backoff).
    gaps = [b - a for a, b in itertools.pairwise(starts)]
    assert len(gaps) == 2 and gaps[0] >= 0.4 and gaps[1] >= 0.8
    assert sleeper.poll() is not None  # the healthy component was stopped too
    assert "boom" in (tmp_path / "logs" / "crasher.log").read_text()


def test_a_killed_child_is_named_with_its_signal_and_restarted(tmp_path: Path) -> None:
    reports: list[str] = []
    sup = Supervisor(tmp_path / "logs", reports.append, backoff_base=0.1, grace=5)
    sup.start(Component("victim", [sys.executable, "-c", "import time; time.sleep(60)"]))
    first = sup.running[0].process
    thread = threading.Thread(target=sup.watch)
    thread.start()
    try:
        os.kill(first.pid, signal.SIGKILL)
        wait_for(lambda: sup.running[0].process.pid != first.pid, timeout=20, what="the restart")
        assert sup.running[0].process.poll() is None
    finally:
        sup.stop_requested.set()
        thread.join(30)
    assert any(r.startswith("victim was killed by SIGKILL; failure 1 in a row") for r in reports)


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


@pytest.mark.parametrize("readiness", ["callable", "log line"])
def test_a_restarted_child_that_becomes_ready_again_starts_its_backoff_over(
    tmp_path: Path, readiness: str
) -> None:
    reports: list[str] = []
    # Dies 1 s after each start; ready while it runs: never "failing in a row".
    sup = Supervisor(tmp_path / "logs", reports.append, max_restarts=2, backoff_base=0.1, stable_after=600)
    argv = [sys.executable, "-c", "import time; print('consuming now', flush=True); time.sleep(1)"]
    if readiness == "callable":
        component = Component("blip", argv, ready=lambda: True)
    else:
        component = Component("blip", argv, ready_line="consuming now")
    sup.start(component)
    thread = threading.Thread(target=sup.watch)
    thread.start()
    try:
        wait_for(lambda: sum("restarted blip" in r for r in reports) >= 4, timeout=30, what="4 restarts")
        assert sup.exit_code == 0 and not any("stopping TunePlane" in r for r in reports)
        assert any(r == "blip is up again after 1 failure(s)" for r in reports)
        assert all("failure 1 in a row" in r for r in reports if r.startswith("blip exited"))
    finally:
        sup.stop_requested.set()
        thread.join(30)


def test_a_child_that_never_writes_its_ready_line_is_not_ready(tmp_path: Path) -> None:
    reports: list[str] = []
    sup = Supervisor(tmp_path / "logs", reports.append, max_restarts=2, backoff_base=0.1, stable_after=600)
    argv = [sys.executable, "-c", "import time; print('not yet', flush=True); time.sleep(0.5)"]
    component = Component("stuck", argv, ready_line="consuming now", ready_timeout=0.1)
    with pytest.raises(ComponentFailed, match="not ready"):
        sup.start(component)
    sup.stop_all()


def test_a_node_side_child_does_not_inherit_the_servers_store_keys(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`tuneplane up` holds the S3 store's keys in its environment for the server and the node gateway;
    its local agent (and so every member it starts) is spawned without them (issue 32)."""
    from tuneplane.app.components import UpContext
    from tuneplane.app.node_gateway import local
    from tuneplane.app.s3store import SERVER_ONLY_ENV

    for name in SERVER_ONLY_ENV:
        monkeypatch.setenv(name, f"secret-{name}")
    monkeypatch.setenv("TP_KEPT", "kept")
    monkeypatch.setattr(local, "ensure_local_enrollment", lambda *_a: None)
    ctx = UpContext(host="127.0.0.1", port=1, database_url="postgresql://x/y", data_dir=tmp_path)
    gateway, agent = local.node_components(ctx)
    assert agent.withhold_env == SERVER_ONLY_ENV and gateway.withhold_env == ()
    sup = Supervisor(tmp_path / "logs", lambda _m: None, grace=5)
    dump = "import json, os; print(json.dumps(dict(os.environ)), flush=True)"
    for name, withheld in (("agent", agent.withhold_env), ("gateway", ())):
        process, log = sup._spawn(Component(name, [sys.executable, "-c", dump], withhold_env=withheld))
        process.wait(30)
        seen = log.read_text()
        assert "TP_KEPT" in seen
        assert all((f"secret-{n}" in seen) == (name == "gateway") for n in SERVER_ONLY_ENV), (name, seen)


def test_only_the_server_the_node_gateway_and_the_worker_get_the_store_keys(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Walking issue 32: `tuneplane up` gave the S3 keys to the embedded PostgreSQL and the telemetry
    gateway too (/proc/<pid>/environ), which never use them; the docs name the three that do."""
    from tuneplane.app import components
    from tuneplane.app.components import UpContext, embedded_postgres_component
    from tuneplane.app.node_gateway import local
    from tuneplane.app.s3store import SERVER_ONLY_ENV

    ctx = UpContext(host="127.0.0.1", port=1, database_url="postgresql://x/y", data_dir=tmp_path)
    monkeypatch.setattr(local, "ensure_local_enrollment", lambda *_a: None)
    every = [embedded_postgres_component(tmp_path / "pg", tmp_path)[0], *components.up_components(ctx)]
    holders = sorted(c.name for c in every if not set(SERVER_ONLY_ENV) & set(c.withhold_env))
    assert holders == ["node-gateway", "server", "worker"]
