"""`tuneplane jobs show` and `tuneplane jobs exempt-idle`, and the job page, for the idle-GPU policy: a
real HTTP server on loopback, the real sweep, simulated GPUs (NVML-shaped samples through the real
telemetry gateway, tests/simulated_gpus.py)."""

from __future__ import annotations

import datetime as dt
import html
import json
import re

import httpx

from tests.launch_fixtures import run_to_running
from tests.simulated_gpus import IDLE, post_samples
from tests.telemetry_support import member_token, running_gateway
from tuneplane.app.db import Database

CONSOLE_GPUS = 2  # the `server` and `cli` fixtures: tests/db/conftest.py


def idle_running_job(cli, db: Database, db_url: str, server: dict) -> int:
    """A 2-GPU job, running, whose simulated GPUs were idle for 31 minutes, warned by the real sweep."""
    db.call(
        "set_idle_policy",
        server["root_id"],
        "local",
        None,
        None,
        None,
        None,
        "reclaim",
        dt.timedelta(minutes=15),
    )
    result = cli("submit", "--recipe", "demo", "--gpus-per-node", "2", "--yes", "--json")
    assert result.exit_code == 0, result.output
    job_id = json.loads(result.stdout)["job_id"]
    db.call("reserve_next", server["fleet"], 1000)
    (member,) = run_to_running(db, job_id)
    now = db.fetch_one("SELECT now() AS t")["t"]
    with running_gateway(db_url) as gateway:
        token = member_token(db, job_id, 1, 0)
        post_samples(
            gateway.url,
            token,
            {g: IDLE for g in member["gpu_indices"]},
            now.timestamp() - 31 * 60,
            now.timestamp(),
        )
    assert db.call("sweep_idle_jobs", 100, now)[0]["warned"] == 1
    return job_id


def test_show_says_the_idle_warning_and_its_deadline(cli, db: Database, db_url: str, server: dict) -> None:
    job_id = idle_running_job(cli, db, db_url, server)
    shown = cli("jobs", "show", str(job_id)).output
    warning = "GPUs idle for 30 min (utilization < 5 %, power < 20 % on all 2 GPUs); it will be stopped at"
    assert f"job {job_id} running: {warning}" in shown
    assert f"idle warning     {warning}" in shown
    deadline = db.fetch_one("SELECT deadline FROM job_idle WHERE job_id = %s", (job_id,))["deadline"]
    assert f"idle deadline    {deadline.astimezone(dt.UTC):%Y-%m-%d %H:%M} UTC" in shown
    assert "idle GPU-s       3,600 GPU-seconds found idle" in shown
    page = httpx.get(f"{server['url']}/jobs/{job_id}", headers={"Authorization": f"Bearer {server['alice']}"})
    assert page.status_code == 200
    assert 'id="job-idle-warning"' in page.text and html.escape(warning, quote=False) in page.text
    assert (
        f'Deadline: <time datetime="{deadline.isoformat()}">{deadline.astimezone(dt.UTC):%Y-%m-%d %H:%M} UTC'
        in page.text
    )
    assert 'id="job-idle-status"' in page.text and "3,600 GPU-seconds found idle so far" in page.text
    home = httpx.get(f"{server['url']}/", headers={"Authorization": f"Bearer {server['alice']}"})
    assert 'id="dashboard-idle"' in home.text and f"Job {job_id}</a>: " in home.text
    assert html.escape(warning, quote=False) in home.text


def test_exempt_idle_is_for_admins_needs_a_reason_and_is_on_the_timeline(
    cli, db: Database, db_url: str, server: dict
) -> None:
    job_id = idle_running_job(cli, db, db_url, server)
    refused = cli("jobs", "exempt-idle", str(job_id), "--reason", "mine")
    assert refused.exit_code == 1 and "needs the admin role" in refused.output
    empty = cli("jobs", "exempt-idle", str(job_id), "--reason", " ", user="root")
    assert empty.exit_code == 1 and "reason" in empty.output
    done = cli("jobs", "exempt-idle", str(job_id), "--reason", "profiling run", user="root")
    assert (
        done.exit_code == 0 and f"job {job_id} is exempt from the idle policy (profiling run)" in done.output
    )
    shown = cli("jobs", "show", str(job_id)).output
    assert "idle exempt      by root: profiling run" in shown and "idle deadline" not in shown
    events = json.loads(cli("jobs", "show", str(job_id), "--json").stdout)["events"]
    assert events[-1]["reason"] == "exempt from the idle policy by root: profiling run"
    missing = cli("jobs", "exempt-idle", "999999", "--reason", "x", user="root")
    assert missing.exit_code == 1 and "no job 999999" in missing.output


def test_the_fleet_page_shows_each_gpus_last_samples_and_marks_the_idle_ones(
    cli, db: Database, db_url: str, server: dict
) -> None:
    job_id = idle_running_job(cli, db, db_url, server)
    headers = {"Authorization": f"Bearer {server['root']}"}
    page = httpx.get(f"{server['url']}/fleets/local", headers=headers)
    assert page.status_code == 200
    gpus = re.findall(r'<div class="gpu( gpu-idle)?" data-gpu="(\d)">(.*?)</div>', page.text, re.S)
    assert [(idle, index) for idle, index, _ in gpus] == [(" gpu-idle", "0"), (" gpu-idle", "1")]
    for _, _, text in gpus:
        assert f"job {job_id}</a> rank 0" in text and "0 % util, 4.0 GiB used, 70/700 W" in text
        assert '<span class="tag idle"' in text
    data = httpx.get(f"{server['url']}/fleets", headers={**headers, "Accept": "application/json"}).json()
    (gpu, _) = next(n for f in data["fleets"] for n in f["node_list"])["gpu_list"]
    assert (gpu["job_id"], gpu["utilization"], gpu["power_limit_watts"], gpu["idle"]) == (
        job_id,
        0.0,
        700.0,
        True,
    )
