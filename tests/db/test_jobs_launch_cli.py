"""`tuneplane jobs show|cancel|logs` against a real HTTP server on loopback (click's runner, and a real
subprocess for --follow)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.helpers import OutputWatcher
from tests.launch_fixtures import report, run_to_running
from tests.submission_setup import add_node
from tuneplane.app.db import Database

REPO = Path(__file__).resolve().parents[2]


CONSOLE_ROLES = {"alice": "user", "bob": "user"}  # the `server` and `cli` fixtures: tests/db/conftest.py


def submit(cli) -> int:
    result = cli("submit", "--recipe", "demo", "--yes", "--json")
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)["job_id"]


def start(db: Database, server: dict, job_id: int) -> dict:
    db.call("reserve_next", server["fleet"], 1000)
    (member,) = run_to_running(db, job_id)
    return member


def test_show_of_a_queued_job_says_why_it_waits_and_its_place(cli) -> None:
    submit(cli)
    second = submit(cli)
    shown = cli("jobs", "show", str(second))
    assert shown.exit_code == 0, shown.output
    assert "why it waits     2nd in queue (fleet local, 2 waiting; job" in shown.output
    assert "attempts: none yet" in shown.output
    data = json.loads(cli("jobs", "show", str(second), "--json").stdout)
    assert data["waiting"]["position"] == 2 and data["members"] == []


def test_show_of_a_running_job_lists_attempts_and_members(cli, db: Database, server: dict) -> None:
    job_id = submit(cli)
    member = start(db, server, job_id)
    report(db, "member_exited", member, exit_code=3)
    shown = cli("jobs", "show", str(job_id)).output
    assert f"job {job_id} failed" in shown and "why it waits" not in shown
    assert "#1   failed" in shown and "[commit: all 1 member(s) prepared]" in shown
    member_line = next(line for line in shown.splitlines() if "local-1" in line)
    # Memory for people (exact bytes in --json); how long it ran.
    assert member_line.split()[:7] == ["1", "0", "local-1", "-", "1.0", "GiB", "failed"]
    assert " 3 " in member_line and "released" in member_line
    exact = json.loads(cli("jobs", "show", str(job_id), "--json").stdout)
    assert exact["memory_per_node"] == 1024**3 and exact["members"][0]["memory_bytes"] == 1024**3
    assert "memory_per_node  1.0 GiB" in shown


def test_cancel_prints_the_outcome_and_a_second_cancel_is_refused(cli, db: Database, server: dict) -> None:
    job_id = submit(cli)
    other = cli("jobs", "cancel", str(job_id), user="bob")
    assert other.exit_code == 1 and f"no job {job_id} of yours" in other.output
    done = cli("jobs", "cancel", str(job_id), "--reason", "typo in params")
    assert done.exit_code == 0 and f"job {job_id} cancelled" in done.output
    events = json.loads(cli("jobs", "show", str(job_id), "--json").stdout)["events"]
    assert "typo in params" in events[-1]["reason"]
    again = cli("jobs", "cancel", str(job_id))
    assert again.exit_code == 1 and "already cancelled" in again.output


def test_logs_print_everything_stored_in_bounded_reads(cli, db: Database, server: dict) -> None:
    job_id = submit(cli)
    member = start(db, server, job_id)
    offset, expected = 0, ""
    for i in range(40):
        line = f"{i:03d} " + "x" * 9000 + "\n"  # 40 × 9 KB: several 256 KiB reads
        report(db, "member_log", member, stream="stdout", offset=offset, text=line)
        offset += len(line)
        expected += line
    report(db, "member_log", member, stream="stderr", offset=0, text="warn\n")
    out = cli("jobs", "logs", str(job_id))
    assert out.exit_code == 0 and out.stdout == expected
    assert cli("jobs", "logs", str(job_id), "--stream", "stderr").stdout == "warn\n"
    assert cli("jobs", "logs", str(job_id), "--tail", "9005").stdout == expected[-9005:]
    bad = cli("jobs", "logs", str(job_id), "--member", "3")
    assert bad.exit_code == 1 and "no member rank 3" in bad.output
    neg = cli("jobs", "logs", str(job_id), "--tail", "-1")
    assert neg.exit_code == 1 and "tail" in neg.output
    hidden = cli("jobs", "logs", str(job_id), user="bob")
    assert hidden.exit_code == 1 and "no job" in hidden.output and "xxx" not in hidden.output


def _cli_env(server: dict, tmp_path: Path) -> dict:
    return {
        **os.environ,
        "TUNEPLANE_CONFIG": str(tmp_path / "none.toml"),
        "TUNEPLANE_SERVER": server["url"],
        "TUNEPLANE_TOKEN": server["alice"],
        "PYTHONUNBUFFERED": "1",
    }


def _follow(job_id: int, env: dict) -> subprocess.Popen:
    """`tuneplane jobs logs JOB --follow` as a real process (it polls until the job ends)."""
    return subprocess.Popen(
        [sys.executable, "-P", "-m", "tuneplane", "jobs", "logs", str(job_id), "--follow", "--poll", "0.1"],
        env=env,
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )


def test_logs_follow_prints_new_output_and_stops_when_the_job_ends(
    db: Database, server: dict, tmp_path: Path
) -> None:
    env = _cli_env(server, tmp_path)
    submitted = subprocess.run(
        [sys.executable, "-P", "-m", "tuneplane", "submit", "--recipe", "demo", "--yes", "--json"],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    job_id = json.loads(submitted.stdout)["job_id"]
    follower = _follow(job_id, env)
    try:
        watcher = OutputWatcher(follower)
        member = start(db, server, job_id)  # the job was queued when the follower started
        report(db, "member_log", member, stream="stdout", offset=0, text="first line\n")
        watcher.wait_for_line("first line", timeout=30)
        report(db, "member_log", member, stream="stdout", offset=11, text="second line\n")
        watcher.wait_for_line("second line", timeout=30)
        assert follower.poll() is None  # still following: the job runs
        report(db, "member_exited", member, exit_code=0)
        assert follower.wait(timeout=30) == 0
    finally:
        if follower.poll() is None:
            follower.kill()
            follower.wait()
    assert watcher.text() == "first line\nsecond line"


def _two_member_job(cli, db: Database, server: dict) -> list[dict]:
    add_node(db, server["fleet"], "local-2")
    result = cli("submit", "--recipe", "demo", "--nodes", "2", "--yes", "--json")
    assert result.exit_code == 0, result.output
    job_id = json.loads(result.stdout)["job_id"]
    db.call("reserve_next", server["fleet"], 1000)
    members = sorted(run_to_running(db, job_id), key=lambda m: m["rank"])
    assert [m["rank"] for m in members] == [0, 1]
    return [{**m, "job_id": job_id} for m in members]


def test_logs_of_a_two_member_job_show_both_ranks_prefixed(cli, db: Database, server: dict) -> None:
    rank0, rank1 = _two_member_job(cli, db, server)
    report(db, "member_log", rank0, stream="stdout", offset=0, text="zero says hi\nzero again\n")
    report(db, "member_log", rank1, stream="stdout", offset=0, text="one says hi\nno newline yet")
    out = cli("jobs", "logs", str(rank0["job_id"]))
    assert out.exit_code == 0, out.output
    assert out.stdout.splitlines() == [
        "[rank 0] zero says hi",
        "[rank 0] zero again",
        "[rank 1] one says hi",
        "[rank 1] no newline yet",
    ]
    only = cli("jobs", "logs", str(rank0["job_id"]), "--member", "1")
    assert only.stdout == "one says hi\nno newline yet"


def test_logs_follow_follows_every_member_until_the_job_ends(
    cli, db: Database, server: dict, tmp_path: Path
) -> None:
    rank0, rank1 = _two_member_job(cli, db, server)
    env = _cli_env(server, tmp_path)
    follower = _follow(rank0["job_id"], env)
    try:
        watcher = OutputWatcher(follower)
        report(db, "member_log", rank1, stream="stdout", offset=0, text="from one\n")
        watcher.wait_for_line("[rank 1] from one", timeout=30)
        report(db, "member_log", rank0, stream="stdout", offset=0, text="from zero\n")
        watcher.wait_for_line("[rank 0] from zero", timeout=30)
        assert follower.poll() is None
        report(db, "member_log", rank1, stream="stdout", offset=9, text="one: done\n")
        report(db, "member_exited", rank0, exit_code=0)
        report(db, "member_exited", rank1, exit_code=0)
        assert follower.wait(timeout=30) == 0
    finally:
        if follower.poll() is None:
            follower.kill()
            follower.wait()
    assert "[rank 1] one: done" in watcher.text()
