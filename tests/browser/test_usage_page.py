"""A browser opens the Usage page: the GPU-hours chart draws one series per team, and the CSV it exports is
the table it shows."""

from __future__ import annotations

import csv
import io
import json
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.console_server import serving_console
from tests.launch_fixtures import make_fleet, make_job, make_node, report, run_to_running
from tests.submission_setup import add_user
from tuneplane.app.db import Database

pytestmark = pytest.mark.browser


@pytest.fixture
def server_url(db_url: str, tmp_path: Path, port: int) -> Iterator[str]:
    with serving_console(db_url, tmp_path, port) as url:
        yield url


def test_usage_chart_renders_for_two_teams_and_csv_is_the_table(page, server_url: str, db: Database) -> None:
    from playwright.sync_api import expect

    add_user(db, "root", "admin", password="root-pw")
    users = [add_user(db, "alice"), add_user(db, "bob")]
    fleet = make_fleet(db)
    make_node(db, fleet, "n0", gpus=4)
    jobs = [make_job(db, u, fleet, gpus_per_node=2) for u in users]
    db.call("reserve_next", fleet, 10)
    for job_id in jobs:
        for m in run_to_running(db, job_id):
            report(db, "member_exited", m, exit_code=0)

    page.goto(f"{server_url}/usage")
    page.fill("#username", "root")
    page.fill("#password", "root-pw")
    page.click("button[type=submit]")
    expect(page).to_have_url(re.compile(r"/usage$"))
    chart = page.locator("#usage-chart")
    expect(chart).to_have_attribute("data-drawn", "2")
    expect(chart.locator("canvas")).to_have_count(1)
    legend = chart.locator(".u-legend")
    expect(legend).to_contain_text("alice")
    expect(legend).to_contain_text("bob")
    # One day of data: the x axis spans that day (half a day either side for its bars), labelled by date,
    # not uPlot's automatic years.
    expect(chart).to_have_attribute("data-x-ticks", re.compile(r"[A-Z][a-z]{2} \d"))
    day = page.evaluate("JSON.parse(document.getElementById('usage-chart').dataset.chart).days")
    low, high = json.loads(chart.get_attribute("data-x-range"))
    assert len(day) == 1 and (low, high) == (day[0] - 43200, day[0] + 43200)
    ticks = json.loads(chart.get_attribute("data-x-ticks"))
    assert ticks and all(re.fullmatch(r"[A-Z][a-z]{2} \d{1,2}", t) for t in ticks), ticks

    shown = [
        [cell.strip() for cell in row.locator("th, td").all_inner_texts()]
        for row in page.locator("#usage-table tr").all()
    ]
    with page.expect_download() as download_info:
        page.click("#usage-csv")
    exported = list(csv.reader(io.StringIO(Path(download_info.value.path()).read_text())))
    assert exported == shown and len(shown) == 3
