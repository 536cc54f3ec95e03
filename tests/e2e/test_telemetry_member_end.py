"""A member's metrics end to end with the agent's collector lifecycle (workers.agent.collectors), real
collector processes, a real gateway on loopback and real PostgreSQL: a member that runs 0.2 s has every
point stored and its metrics `complete` (ten times in a row), and a collector killed with SIGKILL mid-run
and mid-send is restarted and stores every point exactly once."""

from __future__ import annotations

import asyncio
import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psycopg
import pytest

from tests.conftest import free_port
from tests.e2e.telemetry_processes import (
    expected_points,
    local_port,
    start_gateway,
    stop,
    stored_points,
    tcp_connections,
)
from tests.telemetry_support import make_job, make_user, member_token, running_gateway
from tuneplane.app.db import Database
from tuneplane.workers.agent.collectors import MemberCollectors
from tuneplane.workers.agent.directories import AgentPaths
from tuneplane.workers.agent.member_records import MemberRecord, MemberStore, member_tag
from tuneplane.workers.collector import tfrecord
from tuneplane.workers.proctree import TAG_VARIABLE

pytestmark = pytest.mark.e2e

# A member: copies prepared metric files into its output directory in pieces, sleeping between them.
MEMBER = r"""
import os, sys, time
src, out, pieces, pause = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
for name in sorted(os.listdir(src)):
    os.makedirs(os.path.join(out, os.path.dirname(name.replace("__", "/"))), exist_ok=True)
files = {n: open(os.path.join(src, n), "rb").read() for n in sorted(os.listdir(src))}
handles = {n: open(os.path.join(out, n.replace("__", "/")), "ab") for n in files}
for i in range(pieces):
    for n, data in files.items():
        size = -(-len(data) // pieces)
        handles[n].write(data[i * size : (i + 1) * size])
        handles[n].flush()
    time.sleep(pause)
"""


def _event(step: int, tag: str, value: float) -> bytes:
    from tensorboardX.proto import event_pb2, summary_pb2

    event = event_pb2.Event(step=step, wall_time=1.7e9 + step)
    event.summary.value.append(summary_pb2.Summary.Value(tag=tag, simple_value=value))
    return event.SerializeToString()


def _prepare_sources(directory: Path, tb_points: int, jsonl_points: int) -> None:
    """Event file and JSONL file the member writes; names use '__' for '/'."""
    directory.mkdir(parents=True)
    from tensorboardX.proto import event_pb2

    version = event_pb2.Event(wall_time=1.7e9, file_version="brain.Event:2").SerializeToString()
    frames = [tfrecord.frame(version)] + [
        tfrecord.frame(_event(step, "train/loss", 1.0 / (step + 1))) for step in range(tb_points)
    ]
    (directory / "tb__events.out.tfevents.1.member").write_bytes(b"".join(frames))
    lines = [json.dumps({"step": s, "lr": s * 1e-4, "eval_loss": 0.5}) for s in range(jsonl_points // 2)]
    (directory / "metrics.jsonl").write_text("\n".join(lines) + "\n")


def _member(sources: Path, out: Path, pieces: int, pause: float) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", MEMBER, str(sources), str(out), str(pieces), str(pause)])


def _metrics_state(db: Database, job: int) -> dict:
    return db.fetch_one("SELECT state, reason FROM telemetry_members WHERE job_id = %s", (job,)) or {}


def _stored(db_url: str, job: int):
    with psycopg.connect(db_url) as conn:
        return stored_points(conn, job)


def _job_and_member_dir(db: Database, tmp: Path) -> tuple[int, str, Path]:
    """A job with a member token, and the member's directory with an empty output/."""
    job = make_job(db, make_user(db, "alice"))
    member_dir = tmp / "member"
    (member_dir / "output").mkdir(parents=True)
    return job, member_token(db, job), member_dir


def _lifecycle(tmp: Path, gateway_url: str) -> MemberCollectors:
    return MemberCollectors(
        AgentPaths(tmp / "state", tmp / "work"),
        MemberStore(tmp / "state" / "members"),
        {"telemetry_url": gateway_url, "collector_drain_timeout": 120, "sample_interval": 0},
        lambda line: print(line, flush=True),
        ("TUNEPLANE_DATABASE_URL",),
        lambda: "n1",
    )


def test_short_members_have_every_point_stored_and_metrics_complete_ten_times(
    db: Database, db_url: str, tmp_path: Path
) -> None:
    sources = tmp_path / "sources"
    _prepare_sources(sources, 5000, 5000)
    owner = make_user(db, "alice")
    with running_gateway(db_url) as gateway:
        collectors = _lifecycle(tmp_path, gateway.url)

        async def one_member(run: int) -> tuple[int, Path]:
            job = make_job(db, owner)
            token = member_token(db, job)
            member_dir = tmp_path / "members" / str(run)
            out = member_dir / "output"
            out.mkdir(parents=True)
            record = MemberRecord(
                member_id=run, attempt_id=run, job_id=job, attempt=1, rank=0, state="running"
            )
            collectors.store.save(record)
            collectors.start(record, member_dir, token)  # the collector starts with the member …
            started = time.monotonic()
            member = _member(sources, out, 2, 0.1)
            assert await asyncio.to_thread(member.wait, 30) == 0
            assert time.monotonic() - started < 5
            record.state = "ended"
            collectors.store.save(record)
            # … and the member is gone long before the collector has even finished starting up.
            assert await collectors.drain(record, member_dir)
            await collectors.retiring[run]  # the drained collector exits (bounded) and its spool goes
            assert not collectors.spool_dir(run).exists()  # all acknowledged: nothing left on the node
            return job, out

        async def all_runs() -> list[tuple[int, Path]]:
            return [await one_member(run) for run in range(10)]

        results = asyncio.run(all_runs())
    for job, out in results:
        expected = expected_points(out)
        assert sum(expected.values()) == 10_000
        assert _stored(db_url, job) == expected
        assert _metrics_state(db, job) == {"state": "complete", "reason": ""}


def test_collector_killed_mid_run_and_mid_send_is_restarted_and_stores_every_point_once(
    db: Database, db_url: str, tmp_path: Path
) -> None:
    sources = tmp_path / "sources"
    _prepare_sources(sources, 60_000, 60_000)
    job, token, member_dir = _job_and_member_dir(db, tmp_path)
    out = member_dir / "output"
    port = free_port()
    gateway = start_gateway(db_url, port, tmp_path / "gateway.log")
    collectors = _lifecycle(tmp_path, f"http://127.0.0.1:{port}")
    record = MemberRecord(member_id=1, attempt_id=1, job_id=job, attempt=1, rank=0, state="running")
    collectors.store.save(record)

    def stored() -> int:
        return db.fetch_one(
            "SELECT coalesce(sum(point_count), 0) AS n FROM telemetry_series WHERE job_id = %s", (job,)
        )["n"]

    async def until(condition, what: str, timeout: float = 90) -> None:
        deadline = time.monotonic() + timeout
        while not condition():
            assert time.monotonic() < deadline, f"timed out waiting for {what}"
            await asyncio.sleep(0.02)

    async def restarted(pid: int) -> None:
        await until(lambda: record.collector_pid not in (pid, None), "the collector to be restarted")

    async def scenario() -> bool:
        collectors.start(record, member_dir, token)
        member = _member(sources, out, 40, 0.15)  # about 6 s of writing
        # Mid-run: killed once it has stored part of the files.
        await until(lambda: stored() > 0, "a first stored batch")
        pid = record.collector_pid
        os.kill(pid, signal.SIGKILL)
        await restarted(pid)
        # Mid-send: the gateway is frozen, so a request sits unread on its socket when the collector dies;
        # the gateway then stores that batch for a collector that never hears back.
        gateway.send_signal(signal.SIGSTOP)
        try:
            await until(lambda: _request_waiting(port), "a request on the wire")
            pid = record.collector_pid
            os.kill(pid, signal.SIGKILL)
        finally:
            gateway.send_signal(signal.SIGCONT)
        await restarted(pid)
        assert await asyncio.to_thread(member.wait, 120) == 0
        record.state = "ended"
        collectors.store.save(record)
        return await collectors.drain(record, member_dir)

    try:
        assert asyncio.run(scenario())
    finally:
        stop(gateway)
    assert collectors.restarts[1] == 2
    expected = expected_points(out)
    assert sum(expected.values()) == 120_000
    assert _stored(db_url, job) == expected
    assert _metrics_state(db, job)["state"] == "complete"
    duplicates = db.fetch_one(
        "SELECT sum(duplicates) AS n FROM telemetry_collectors WHERE job_id = %s", (job,)
    )
    assert duplicates["n"] >= 1  # the batch on the wire when it died was sent again and skipped


def _request_waiting(port: int) -> bool:
    """A connection to the gateway's port holds bytes the (frozen) gateway has not read yet."""
    return any(
        local_port(f) == port and f[3] == "01" and int(f[4].split(":")[1], 16) > 0 for f in tcp_connections()
    )


def test_member_cpu_and_rss_are_shipped_under_canonical_names(
    db: Database, db_url: str, tmp_path: Path
) -> None:
    job, token, member_dir = _job_and_member_dir(db, tmp_path)
    with running_gateway(db_url) as gateway:
        collectors = _lifecycle(tmp_path, gateway.url)
        collectors.settings["sample_interval"] = 0.2
        record = MemberRecord(member_id=3, attempt_id=3, job_id=job, attempt=1, rank=0, state="running")
        collectors.store.save(record)
        tag = member_tag(collectors.paths, 3)
        stop_flag = tmp_path / "stop"
        busy = f"import os\nwhile not os.path.exists({str(stop_flag)!r}): pass\n"

        def cpu_shipped() -> bool:
            return bool(
                db.fetch_all(
                    "SELECT 1 FROM telemetry_series WHERE job_id = %s AND name = 'system/cpu_percent'", (job,)
                )
            )

        async def scenario() -> bool:
            collectors.start(record, member_dir, token)
            member = subprocess.Popen([sys.executable, "-c", busy], env={**os.environ, TAG_VARIABLE: tag})
            deadline = time.monotonic() + 90
            while not cpu_shipped() and time.monotonic() < deadline:
                await asyncio.sleep(0.1)
            stop_flag.write_text("")
            assert await asyncio.to_thread(member.wait, 60) == 0
            record.state = "ended"
            collectors.store.save(record)
            return await collectors.drain(record, member_dir)

        assert asyncio.run(scenario())
    rows = db.fetch_all(
        "SELECT name, canonical, point_count, last_value FROM telemetry_series"
        " WHERE job_id = %s AND source = 'system' ORDER BY name",
        (job,),
    )
    by_name = {r["name"]: r for r in rows}
    assert set(by_name) == {"system/cpu_percent", "system/rss_bytes"}  # no GPUs here: CPU and RSS only
    assert by_name["system/cpu_percent"]["canonical"] == "cpu_utilization"
    assert by_name["system/rss_bytes"]["canonical"] == "memory_rss"
    cpu = db.fetch_one(
        "SELECT max(p.value) AS top FROM telemetry_points p JOIN telemetry_series s ON s.id = p.series_id"
        " WHERE s.job_id = %s AND s.name = 'system/cpu_percent'",
        (job,),
    )
    assert cpu["top"] > 1  # the busy member used CPU (how much depends on the machine's load)


BAD_JSONL = [
    '{"step": 0, "loss": 1.0}',
    '{"step": 9223372036854775808, "loss": 0.9}',  # 2^63
    '{"step": 1, "loss": 1' + "0" * 400 + "}",  # 10^400
    '{"step": 2, "bad\\u0000key": 1.0, "loss": 0.8}',
    '{"step": 3, "' + "k" * 600 + '": 1.0, "loss": 0.7}',
    '{"step": 4, "loss": NaN, "up": Infinity, "down": -Infinity}',
    '{"step": 5, "loss": "diverged", "lr": 0.1}',
    '{"step": 6, "loss": 0.5}',
]


def test_bad_lines_and_damaged_records_lose_only_themselves_and_are_shown(
    db: Database, db_url: str, tmp_path: Path
) -> None:
    from tests.telemetry_support import user_api_token
    from tuneplane.app.web import create_app

    sources = tmp_path / "sources"
    sources.mkdir()
    (sources / "metrics.jsonl").write_text("\n".join(BAD_JSONL) + "\n")
    from tensorboardX.proto import event_pb2

    frames = [tfrecord.frame(event_pb2.Event(file_version="brain.Event:2").SerializeToString())]
    frames += [tfrecord.frame(_event(step, "train/loss", step * 0.5)) for step in range(3000)]
    damaged = {}
    for index, at in ((1000, 3), (2000, 25)):  # a byte of a length field, a byte of a payload
        broken = bytearray(frames[index])
        broken[at] ^= 0x10
        frames[index] = bytes(broken)
        damaged[sum(len(f) for f in frames[:index])] = len(frames[index])
    (sources / "tb__events.out.tfevents.1.member").write_bytes(b"".join(frames))
    alice = make_user(db, "alice")
    job = make_job(db, alice)
    token = member_token(db, job)
    member_dir = tmp_path / "member"
    out = member_dir / "output"
    out.mkdir(parents=True)
    with running_gateway(db_url) as gateway:
        collectors = _lifecycle(tmp_path, gateway.url)
        record = MemberRecord(member_id=4, attempt_id=4, job_id=job, attempt=1, rank=0, state="running")
        collectors.store.save(record)

        async def scenario() -> bool:
            collectors.start(record, member_dir, token)
            member = _member(sources, out, 3, 0.1)
            assert await asyncio.to_thread(member.wait, 60) == 0
            record.state = "ended"
            collectors.store.save(record)
            return await collectors.drain(record, member_dir)

        assert asyncio.run(scenario())
    stored = _stored(db_url, job)
    jsonl = sorted((n, s, v) for (src, n, s, v), c in stored.items() if src == "jsonl:metrics.jsonl")
    finite = [(n, s, v) for n, s, v in jsonl if math.isfinite(v)]
    assert finite == [("loss", 0, 1.0), ("loss", 2, 0.8), ("loss", 3, 0.7), ("loss", 6, 0.5), ("lr", 5, 0.1)]
    assert sorted((n, s, str(v)) for n, s, v in jsonl if not math.isfinite(v)) == [
        ("down", 4, "-inf"),
        ("loss", 4, "nan"),
        ("up", 4, "inf"),
    ]
    tb_steps = sorted(s for (src, n, s, _v) in stored if src == "tensorboard:tb")
    assert tb_steps == [s for s in range(3000) if s not in (999, 1999)]  # every intact record
    refusals = db.fetch_all("SELECT name, reason, count FROM telemetry_refusals WHERE job_id = %s", (job,))
    assert {(r["name"], r["reason"]): r["count"] for r in refusals} == {
        ("loss", "step outside ±(2^53-1)"): 1,
        ("loss", "number too large for a float64"): 1,
        ("", "name holds a NUL or control character"): 1,
        ("", "name longer than 512 characters"): 1,
        ("loss", "value is not a number"): 1,
    }
    regions = db.fetch_all(
        "SELECT file, file_offset, bytes FROM telemetry_damage WHERE job_id = %s ORDER BY file_offset", (job,)
    )
    assert [(r["file"], r["file_offset"], r["bytes"]) for r in regions] == [
        ("tb/events.out.tfevents.1.member", offset, size) for offset, size in sorted(damaged.items())
    ]
    assert _metrics_state(db, job) == {"state": "complete", "reason": ""}

    client = create_app(db_url).test_client()
    headers = {"Authorization": f"Bearer {user_api_token(db, alice)}"}
    job_part = client.get(f"/jobs/{job}/metrics/health", headers=headers).get_data(as_text=True)
    for offset, size in damaged.items():
        assert f"tb/events.out.tfevents.1.member at byte {offset}, {size} bytes" in job_part
    charts = client.get(f"/jobs/{job}/charts", headers=headers).get_data(as_text=True)
    assert "metrics complete" in charts and "1 × step outside ±(2^53-1)" in charts
    assert 'data-name="loss"' in charts
    metrics = client.get(f"/jobs/{job}/metrics?name=loss", headers={**headers, "Accept": "application/json"})
    json.loads(metrics.get_data(as_text=True))  # valid JSON although a value is NaN


def test_sigterm_before_the_collector_finished_starting_is_a_drain_not_a_death(
    db: Database, db_url: str, tmp_path: Path
) -> None:
    job, token, member_dir = _job_and_member_dir(db, tmp_path)
    (member_dir / "output" / "metrics.jsonl").write_text('{"step": 1, "loss": 0.5}\n')
    with running_gateway(db_url) as gateway:
        collectors = _lifecycle(tmp_path, gateway.url)
        record = MemberRecord(member_id=5, attempt_id=5, job_id=job, attempt=1, rank=0, state="ended")
        collectors.store.save(record)
        spool = collectors.spool_dir(5)
        spool.mkdir(parents=True)
        (spool / "token").write_text(token)
        (spool / "member-exited").write_text("")
        assert collectors._spawn(record, member_dir)
        process = collectors.processes[5]
        process.send_signal(signal.SIGTERM)  # long before Python has even imported the collector
        assert process.wait(120) == 0  # not -15: the signal waited for the handler
    assert (spool / "final-sent").exists()
    assert _metrics_state(db, job)["state"] == "complete"
    assert sum(_stored(db_url, job).values()) == 1


def test_a_collector_that_lingers_after_its_drain_is_killed_within_its_bound_and_holds_no_end_back(
    db: Database, db_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The drain ends at final-sent (the member's end is reported then), and a collector still alive
    EXIT_GRACE seconds later is killed; its spool goes once it is gone."""
    from tuneplane.workers.collector.markers import EXIT_GRACE, HOLD_EXIT_ENV

    monkeypatch.setenv(HOLD_EXIT_ENV, "600")  # the collector would stay 10 minutes after its final batch
    job, token, member_dir = _job_and_member_dir(db, tmp_path)
    (member_dir / "output" / "metrics.jsonl").write_text(
        '{"step": 1, "loss": 0.5}\n{"step": 2, "loss": 0.4}\n'
    )
    with running_gateway(db_url) as gateway:
        collectors = _lifecycle(tmp_path, gateway.url)
        record = MemberRecord(member_id=7, attempt_id=7, job_id=job, attempt=1, rank=0, state="running")
        collectors.store.save(record)

        async def member_ends() -> tuple[int | None, float, bool]:
            collectors.start(record, member_dir, token)
            process = collectors.processes[7]
            record.state = "ended"
            collectors.store.save(record)
            assert await collectors.drain(record, member_dir)
            drained = time.monotonic()
            alive_at_drain = process.poll() is None
            await collectors.retiring[7]
            return process.returncode, time.monotonic() - drained, alive_at_drain

        code, retired_after, alive_at_drain = asyncio.run(member_ends())
    assert alive_at_drain  # the drain did not wait for the lingering collector's exit …
    assert code == -signal.SIGKILL  # … which the bound ended, not the collector itself
    assert retired_after < EXIT_GRACE + 10  # the bound, with room for a loaded machine's reaping
    assert not collectors.spool_dir(7).exists()
    assert _metrics_state(db, job)["state"] == "complete"
    assert sum(_stored(db_url, job).values()) == 2
