"""The collector's unhappy paths with real files and a real collector process (in-process gateway, real
PostgreSQL): more metric files than descriptors, files that cannot be looked at, names that are not UTF-8.
Each test ends with the member's metrics drained: every readable point stored exactly once."""

from __future__ import annotations

import json
import os
import resource
import shutil
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from tests.conftest import free_port
from tests.e2e.telemetry_processes import REPO, kill9, stored_points
from tests.helpers import wait_for
from tests.small_fs import fill_up, small_tmpfs
from tests.telemetry_support import GatewayThread, make_job, make_user, member_token, running_gateway
from tuneplane.app.db import Database
from tuneplane.workers.collector.markers import FINAL_SENT, MEMBER_EXITED

pytestmark = pytest.mark.e2e


@pytest.fixture
def gateway(db_url: str) -> Iterator[GatewayThread]:
    with running_gateway(db_url) as gw:
        yield gw


@pytest.fixture
def conn(db_url: str) -> Iterator[psycopg.Connection]:
    with psycopg.connect(db_url, autocommit=True) as connection:
        yield connection


class Collectors:
    """Starts real collector processes (their output in one log) and kills any still running at the end."""

    def __init__(self, log: Path) -> None:
        self.log = log
        self.started: list[subprocess.Popen] = []

    def start(
        self, out: Path, spool: Path, url: str, token: str, nofile: int | None = None, extra: tuple = ()
    ) -> subprocess.Popen:
        def limits() -> None:
            if nofile is not None:
                resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))

        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        env.pop("TUNEPLANE_DATABASE_URL", None)
        with open(self.log, "ab") as handle:
            process = subprocess.Popen(
                [sys.executable, "-P", "-m", "tuneplane", "collector", "--output-dir", str(out),
                 "--spool-dir", str(spool), "--gateway", url, "--token", token, "--poll-interval", "0.1",
                 "--fsync-interval", "0.1", "--sample-interval", "0", *extra],
                stdout=handle, stderr=subprocess.STDOUT, cwd=REPO, env=env, preexec_fn=limits,
            )  # fmt: skip
        self.started.append(process)
        return process

    def kill_all(self) -> None:
        for process in self.started:
            if process.poll() is None:
                process.kill()
                process.wait(10)


@pytest.fixture
def collectors(tmp_path: Path) -> Iterator[Collectors]:
    started = Collectors(tmp_path / "collector.log")
    try:
        yield started
    finally:
        started.kill_all()


def _stored_while_running(
    conn: psycopg.Connection, job: int, process: subprocess.Popen, log: Path, total: int
) -> None:
    def stored() -> bool:
        if process.poll() is not None:
            raise AssertionError(f"the collector exited ({process.returncode}):\n{log.read_text()[-3000:]}")
        return sum(stored_points(conn, job).values()) >= total

    wait_for(stored, timeout=120, interval=0.2, what=f"{total} points stored")


def _logged(process: subprocess.Popen, log: Path, text: str) -> None:
    def said() -> bool:
        if process.poll() is not None:
            raise AssertionError(f"the collector exited ({process.returncode}):\n{log.read_text()[-3000:]}")
        return text in log.read_text()

    wait_for(said, timeout=60, interval=0.1, what=text)


def _drain(spool: Path, process: subprocess.Popen, log: Path) -> None:
    (spool / MEMBER_EXITED).write_text("1\n")
    process.terminate()
    assert process.wait(120) == 0, log.read_text()[-3000:]
    assert (spool / FINAL_SENT).exists()


def _member(db: Database, tmp_path: Path) -> tuple[int, Path, Path, Path]:
    """A job, and its member's (empty) output directory, spool path and collector log."""
    out = tmp_path / "out"
    out.mkdir()
    return make_job(db, make_user(db, "alice")), out, tmp_path / "spool", tmp_path / "collector.log"


def _write_steps(path: Path, steps: range, divisor: int) -> None:
    for step in steps:
        _append(path, step, step / divisor)


def _loss_points(steps: range, divisor: int) -> Counter:
    """What _write_steps wrote to metrics.jsonl, as stored_points counts it."""
    return Counter(("jsonl:metrics.jsonl", "loss", step, step / divisor) for step in steps)


def _append(path: Path, step: int, value: float) -> None:
    with open(path, "a") as handle:
        handle.write(json.dumps({"step": step, "loss": value}) + "\n")


def test_more_metric_files_than_descriptors_are_all_read_and_followed_as_they_grow(
    db: Database, conn: psycopg.Connection, gateway: GatewayThread, collectors: Collectors, tmp_path: Path
) -> None:
    """One file per hyper-parameter trial, 300 of them, and a collector allowed 128 descriptors (soft and
    hard): before, every file stayed open, so past the limit listing a directory failed with EMFILE, which
    os.walk swallows: the files beyond were silently never read (an open that hit the limit instead killed
    the collector at every start). Now idle files are closed and opened again when they grow."""
    job, out, spool, log = _member(db, tmp_path)
    files = [out / f"trial{i:03d}" / "metrics.jsonl" for i in range(300)]
    for i, path in enumerate(files):
        path.parent.mkdir()
        _append(path, 1, float(i))
    process = collectors.start(out, spool, gateway.url, member_token(db, job), nofile=128)
    _stored_while_running(conn, job, process, log, len(files))
    for i, path in enumerate(files):  # every file grows after it was read (and closed) once
        _append(path, 2, i + 0.5)
    _stored_while_running(conn, job, process, log, 2 * len(files))
    _drain(spool, process, log)
    expected = Counter(
        (f"jsonl:trial{i:03d}/metrics.jsonl", "loss", step, value)
        for i in range(len(files))
        for step, value in ((1, float(i)), (2, i + 0.5))
    )
    assert stored_points(conn, job) == expected


def test_files_that_cannot_be_read_or_named_do_not_stop_the_others(
    db: Database, conn: psycopg.Connection, gateway: GatewayThread, collectors: Collectors, tmp_path: Path
) -> None:
    """A symlink loop named like a metrics file (stat: ELOOP) or a file that cannot be opened (EACCES)
    killed the collector at every start, so no file was read; a file name that is not UTF-8 had every
    point refused for its source name. Now such files are skipped and said once, and the name is stored
    with the odd byte written as `\\xe9`."""
    job, out, spool, log = _member(db, tmp_path)
    _append(out / "a.jsonl", 1, 1.0)
    os.symlink("loop.jsonl", out / "loop.jsonl")
    os.symlink("nowhere", out / "dangling.jsonl")
    (out / "dir.jsonl").mkdir()
    refused = _unopenable()
    if refused is not None:  # a regular file even root may not open: EACCES on open, not on stat
        os.symlink(refused, out / "write-only.jsonl")
    _append(out / "dir.jsonl" / "inner.jsonl", 1, 2.0)
    _append(Path(os.fsdecode(os.fsencode(out) + b"/lat\xe9n1.jsonl")), 1, 3.0)
    _append(out / "z.jsonl", 1, 4.0)
    process = collectors.start(out, spool, gateway.url, member_token(db, job))
    _stored_while_running(conn, job, process, log, 4)
    _append(out / "z.jsonl", 2, 5.0)  # still following the files after the bad one
    _stored_while_running(conn, job, process, log, 5)
    _drain(spool, process, log)
    assert stored_points(conn, job) == Counter(
        [
            ("jsonl:a.jsonl", "loss", 1, 1.0),
            ("jsonl:dir.jsonl/inner.jsonl", "loss", 1, 2.0),
            ("jsonl:lat\\xe9n1.jsonl", "loss", 1, 3.0),
            ("jsonl:z.jsonl", "loss", 1, 4.0),
            ("jsonl:z.jsonl", "loss", 2, 5.0),
        ]
    )
    assert log.read_text().count("Too many levels of symbolic links") == 1
    said = log.read_text().count("write-only.jsonl skipped for now: Permission denied")
    assert said == (0 if refused is None else 1)
    # What a file still unreadable at the member's end held is shown as damage, not only logged.
    damage = conn.execute(
        "SELECT source, file, file_offset, bytes, reason FROM tuneplane.telemetry_damage WHERE job_id = %s",
        (job,),
    ).fetchall()
    expected = [] if refused is None else [
        ("jsonl:write-only.jsonl", "write-only.jsonl", 0, os.stat(refused).st_size,
         "file could not be read: Permission denied"),
    ]  # fmt: skip
    assert damage == expected


def _unopenable() -> str | None:
    """A write-only sysfs attribute: a regular file that open() refuses (EACCES) even to root."""
    for candidate in ("/sys/bus/platform/uevent", "/sys/bus/pci/uevent"):
        try:
            os.close(os.open(candidate, os.O_RDONLY | os.O_NONBLOCK))
        except PermissionError:
            return candidate
        except OSError:
            continue
    return None


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A real 1 MiB filesystem (tmpfs) to fill; skipped where mounting is not allowed."""
    with small_tmpfs(tmp_path / "small", "1m") as mount:
        yield mount


def test_a_full_spool_disk_pauses_reading_and_loses_nothing(
    db: Database,
    conn: psycopg.Connection,
    db_url: str,
    small_disk: Path,
    collectors: Collectors,
    tmp_path: Path,
) -> None:
    """The spool's disk fills up (the gateway is down, the member writes on): before, the write raised
    ENOSPC and the collector died, leaving half a frame; started again on the full disk it died in its
    spool's start-up, so even what was spooled was never sent. Now reading pauses (the files are the buffer),
    a collector starts on a full disk and sends what is spooled, and once there is room again every point
    is stored exactly once."""
    job, out, _, log = _member(db, tmp_path)
    spool = small_disk / "spool"
    with open(out / "metrics.jsonl", "w") as handle:  # ~3.6 MB in the spool: over three times the disk
        for step in range(150_000):
            handle.write(json.dumps({"step": step, "loss": step / 7}) + "\n")
    token = member_token(db, job)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    scope = ("--job-id", str(job), "--attempt", "1", "--member", "0", "--batch-points", "2000")
    process = collectors.start(out, spool, url, token, extra=scope)
    _logged(process, log, "spool: cannot write (No space left on device)")
    kill9(process)
    filler = fill_up(small_disk)  # not a byte left, not even for the restarted spool's new segment
    process = collectors.start(out, spool, url, token, extra=scope)
    with running_gateway(db_url, port):
        # What was spooled before the disk filled is sent although nothing can be written.
        sent = lambda: sum(stored_points(conn, job).values()) > 0  # noqa: E731
        wait_for(sent, timeout=60, what="spooled points sent")
        assert process.poll() is None, log.read_text()[-3000:]
        filler.unlink()  # room again
        _stored_while_running(conn, job, process, log, 150_000)
        _drain(spool, process, log)
    assert stored_points(conn, job) == _loss_points(range(150_000), 7)


def test_a_spool_directory_removed_while_running_loses_and_duplicates_nothing(
    db: Database, conn: psycopg.Connection, gateway: GatewayThread, collectors: Collectors, tmp_path: Path
) -> None:
    """Someone (a tmp cleaner, an operator) removes the spool directory under a running collector. Before,
    later batches went into unlinked files and were never sent while the member ran, and the next start
    read every file again under a new spool id (every point stored twice). Now the spool is rebuilt from
    what the collector holds."""
    job, out, spool, log = _member(db, tmp_path)
    path = out / "metrics.jsonl"
    _write_steps(path, range(1000), 3)
    process = collectors.start(out, spool, gateway.url, member_token(db, job))
    _stored_while_running(conn, job, process, log, 1000)
    shutil.rmtree(spool)
    _write_steps(path, range(1000, 2000), 3)
    _stored_while_running(conn, job, process, log, 2000)
    kill9(process)  # the rebuilt spool is what a restart resumes from
    process = collectors.start(out, spool, gateway.url, member_token(db, job))
    _write_steps(path, range(2000, 2500), 3)
    _stored_while_running(conn, job, process, log, 2500)
    _drain(spool, process, log)
    assert stored_points(conn, job) == _loss_points(range(2500), 3)


def test_a_stop_while_a_writer_is_mid_line_ends_at_once_and_the_line_is_read_at_the_next_start(
    db: Database, conn: psycopg.Connection, gateway: GatewayThread, collectors: Collectors, tmp_path: Path
) -> None:
    """SIGTERM without the member-exited marker (an operator, or a service manager stopping the agent's
    whole cgroup) while a writer is mid-line: before, the drain re-read that file in a busy loop until
    the drain deadline (a core spun for 30 s and the stop took that long). Now the drain ends once a
    poll changes nothing; the torn line is read by the next collector once it is whole."""
    job, out, spool, log = _member(db, tmp_path)
    path = out / "metrics.jsonl"
    _append(path, 1, 1.0)
    with open(path, "a") as handle:
        handle.write('{"step": 2, "lo')
    slow = ("--drain-timeout", "120")
    process = collectors.start(out, spool, gateway.url, member_token(db, job), extra=slow)
    _stored_while_running(conn, job, process, log, 1)
    process.terminate()
    assert process.wait(60) == 0, log.read_text()[-3000:]  # before: only after the 120 s deadline
    with open(path, "a") as handle:
        handle.write('ss": 2.0}\n')
    process = collectors.start(out, spool, gateway.url, member_token(db, job))
    _stored_while_running(conn, job, process, log, 2)
    _drain(spool, process, log)
    assert stored_points(conn, job) == Counter(
        [("jsonl:metrics.jsonl", "loss", 1, 1.0), ("jsonl:metrics.jsonl", "loss", 2, 2.0)]
    )


def test_a_second_collector_on_the_same_spool_refuses_to_start(
    db: Database, conn: psycopg.Connection, gateway: GatewayThread, collectors: Collectors, tmp_path: Path
) -> None:
    """Two collectors on one spool (an agent that lost a collector's pid, an operator): before, both read
    the same files from the same positions and wrote batches under the same collector id and sequence
    numbers but cut differently, so the gateway refused one as a conflicting re-send (409, final) or stored
    points twice. Now the spool is locked: the second says so and exits, the first goes on."""
    job, out, spool, log = _member(db, tmp_path)
    path = out / "metrics.jsonl"
    _append(path, 0, 0.0)
    first = collectors.start(out, spool, gateway.url, member_token(db, job), extra=("--batch-points", "300"))
    _stored_while_running(conn, job, first, log, 1)
    second = collectors.start(out, spool, gateway.url, member_token(db, job), extra=("--batch-points", "7"))
    _write_steps(path, range(1, 3000), 3)
    assert second.wait(60) != 0
    assert "is in use by another collector" in log.read_text()
    _stored_while_running(conn, job, first, log, 3000)
    _drain(spool, first, log)
    assert stored_points(conn, job) == _loss_points(range(3000), 3)
    assert not (spool / "rejected").exists()
