"""Idle GPUs in a browser (Playwright driving Debian's Chromium): the Fleet page marks the idle GPUs with
their last samples, the job page shows the warning and its deadline, and Job Charts draws the GPU samples
on a time axis whose labels are times, not 13-digit steps. Simulated GPUs: NVML-shaped samples written
through the real telemetry gateway (tests/simulated_gpus.py), judged by the real sweep."""

from __future__ import annotations

import datetime as dt
import json
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.browser.test_job_page_live import shot
from tests.console_server import serving_console
from tests.launch_fixtures import make_job, run_to_running
from tests.simulated_gpus import IDLE, post_samples
from tests.submission_setup import add_user, one_local_fleet
from tests.telemetry_support import member_token, running_gateway
from tuneplane.app.db import Database

pytestmark = pytest.mark.browser


@pytest.fixture
def warned(db_url: str, db: Database, tmp_path: Path, port: int) -> Iterator[dict]:
    """A running 2-GPU job of alice whose GPUs were idle for 31 minutes, warned by the sweep (reclaim)."""
    fleet = one_local_fleet(db, gpus=2)
    admin = add_user(db, "root", "admin")
    alice = add_user(db, "alice", password="alice-pw")
    db.call("set_idle_policy", admin, "local", None, None, None, None, "reclaim", dt.timedelta(minutes=15))
    job_id = make_job(db, alice, fleet, gpus_per_node=2)
    db.call("reserve_next", fleet, 1000)
    (member,) = run_to_running(db, job_id)
    now = db.fetch_one("SELECT now() AS t")["t"]
    with running_gateway(db_url) as gateway:
        readings = {g: IDLE for g in member["gpu_indices"]}
        post_samples(
            gateway.url, member_token(db, job_id, 1, 0), readings, now.timestamp() - 31 * 60, now.timestamp()
        )
    assert db.call("sweep_idle_jobs", 100, now)[0]["warned"] == 1
    deadline = db.fetch_one("SELECT deadline FROM job_idle WHERE job_id = %s", (job_id,))["deadline"]
    with serving_console(db_url, tmp_path, port) as url:
        yield {"url": url, "job": job_id, "deadline": deadline}


def test_fleet_marks_idle_gpus_job_page_shows_the_deadline_and_charts_use_a_time_axis(
    page, warned: dict
) -> None:
    from playwright.sync_api import expect

    expect.set_options(timeout=15_000)
    page.goto(f"{warned['url']}/login")
    page.fill("#username", "alice")
    page.fill("#password", "alice-pw")
    page.click("button[type=submit]")

    # The job page: the warning with its numbers and the deadline.
    page.goto(f"{warned['url']}/jobs/{warned['job']}")
    warning = page.locator("#job-idle-warning")
    expect(warning).to_contain_text("GPUs idle for 30 min (utilization < 5 %, power < 20 % on all 2 GPUs)")
    expect(warning.locator(".deadline")).to_have_text(
        f"Deadline: {warned['deadline'].astimezone(dt.UTC):%Y-%m-%d %H:%M} UTC"
    )
    shot(page, "idle-warning")

    # The Fleet page: both GPUs marked idle, with their last samples and the job holding them.
    page.goto(f"{warned['url']}/fleets/local")
    idle = page.locator(".gpu.gpu-idle")
    expect(idle).to_have_count(2)
    expect(idle.first.locator(".tag.idle")).to_have_text("idle")
    expect(idle.first).to_contain_text(f"job {warned['job']} rank 0")
    expect(idle.first.locator(".gpu-sample")).to_have_text("0 % util, 4.0 GiB used, 70/700 W")
    shot(page, "fleet-idle-gpus")

    # Job Charts: GPU utilization (source system, step = ms) drawn against wall time, labels are times.
    page.goto(f"{warned['url']}/jobs/{warned['job']}/charts")
    chart = page.locator(".tp-chart[data-name=gpu_utilization]")
    expect(chart).to_have_attribute("data-x", "wall")
    expect(chart).to_have_attribute("data-x-ticks", re.compile(r"\d"))
    ticks = json.loads(chart.get_attribute("data-x-ticks"))
    assert ticks and not any(re.search(r"\d{6,}", t) for t in ticks), ticks
    assert any(re.search(r"\d{1,2}:\d{2}", t) for t in ticks), ticks
    shot(page, "charts-system-time-axis")
