"""What a newcomer reads on the tour's pages (issue 36), in a browser (Playwright driving Debian's Chromium):
chart axes in human units — bytes in binary units, seconds as durations, wall times that fit the range —
for a 10-second job and a 3-day one; each metric drawn once per attempt however many copies were written;
every page reachable from the navigation bar; the Jobs page's Team column and filter. Screenshots of each
page go to $TUNEPLANE_SCREENSHOT_DIR (tour-*.png)."""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.console_server import serving_console
from tests.submission_setup import add_user, one_local_fleet
from tests.telemetry_support import make_job, member_token, running_gateway
from tuneplane.app.db import Database
from tuneplane.app.telemetry import wire

pytestmark = pytest.mark.browser

MiB = 1024**2


def shot(page, name: str) -> None:
    folder = os.environ.get("TUNEPLANE_SCREENSHOT_DIR")
    if folder:
        Path(folder).mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(Path(folder) / f"tour-{name}.png"), full_page=True)


@pytest.fixture
def console(db_url: str, tmp_path: Path, port: int) -> Iterator[dict]:
    with serving_console(db_url, tmp_path, port) as url, running_gateway(db_url) as gateway:
        yield {"url": url, "gateway": gateway}


def _send(gateway, token: str, series: list[tuple[str, str, list[int], list[float], list[float]]]) -> None:
    """(source, name, steps, values, wall times) per series, in one batch."""
    payload = wire.encode(
        "c1",
        1,
        [(src, name, len(steps)) for src, name, steps, _, _ in series],
        [s for _, _, steps, _, _ in series for s in steps],
        [v for _, _, _, values, _ in series for v in values],
        [w for _, _, _, _, walls in series for w in walls],
    )
    response = httpx.post(
        f"{gateway.url}/v1/telemetry/batches", content=payload, headers={"Authorization": f"Bearer {token}"}
    )
    assert response.status_code == 200, response.text


def _login(page, url: str, user: str, password: str) -> None:
    page.goto(f"{url}/login")
    page.fill("#username", user)
    page.fill("#password", password)
    page.click("button[type=submit]")


def _ticks(page, name: str, axis: str = "x") -> list[str]:
    chart = page.locator(f".tp-chart[data-name={name}]")
    raw = chart.get_attribute(f"data-{axis}-ticks")
    return [t for t in json.loads(raw or "[]") if t]


def _system_and_loss(job_seconds: int, every: int, end: float) -> list[tuple]:
    """A member's resident memory (a system series: its step is epoch milliseconds) and its loss, written
    twice (JSONL and TensorBoard copies of one metric), over `job_seconds` ending at `end`."""
    walls = [end - job_seconds + k for k in range(0, job_seconds + 1, every)]
    rss = [300 * MiB + k * (900 * MiB) / len(walls) for k in range(len(walls))]
    steps = list(range(len(walls)))
    loss = [2.0 / (1 + s) for s in steps]
    return [
        ("system", "system/rss_bytes", [int(w * 1000) for w in walls], rss, walls),
        ("jsonl:metrics.jsonl", "train/loss", steps, loss, walls),
        ("tensorboard:run", "loss", steps, loss, walls),
    ]


def test_chart_axes_read_in_human_units_for_a_10_second_and_a_3_day_job(page, console, db: Database) -> None:
    from playwright.sync_api import expect

    expect.set_options(timeout=20_000)
    alice = add_user(db, "alice", password="alice-pw")
    short, long = make_job(db, alice), make_job(db, alice)
    now = time.time()
    _send(console["gateway"], member_token(db, short), _system_and_loss(10, 1, now))
    _send(console["gateway"], member_token(db, long), _system_and_loss(3 * 86400, 3600, now))
    _login(page, console["url"], "alice", "alice-pw")

    page.goto(f"{console['url']}/jobs/{short}/charts")
    memory = page.locator(".tp-chart[data-name=memory_rss]")
    expect(memory).to_have_attribute("data-x", "wall")
    expect(memory).to_have_attribute("data-y-ticks", re.compile(r"MiB|GiB"))
    for label in _ticks(page, "memory_rss", "y"):
        assert re.fullmatch(r"\d+(\.\d+)? (B|KiB|MiB|GiB)", label), label
    seconds = _ticks(page, "memory_rss")
    assert len(seconds) >= 2 and len(set(seconds)) == len(seconds), seconds
    assert all(re.fullmatch(r"\d\d:\d\d:\d\d", t) for t in seconds), seconds  # not :13.500
    # The loss was written twice (JSONL and TensorBoard): one line, the JSONL copy, naming the other.
    loss = page.locator(".tp-chart[data-name=loss]")
    expect(loss).to_have_attribute("data-drawn", "linear:0:1")
    shown = [row.inner_text() for row in loss.locator(".u-legend .u-series").all() if row.is_visible()]
    assert len(shown) == 2, shown  # the x value and the one line (min and max are its band, not entries)
    expect(loss.locator(".u-legend")).to_contain_text("jsonl:metrics.jsonl (also tensorboard:run)")
    shot(page, "charts-10s-wall")
    page.select_option("#tp-x", "relative")
    expect(loss).to_have_attribute("data-x", "relative")
    relative = _ticks(page, "loss")
    assert relative and all(re.fullmatch(r"\d+ s", t) for t in relative), relative
    shot(page, "charts-10s-relative")

    page.goto(f"{console['url']}/jobs/{long}/charts")
    memory = page.locator(".tp-chart[data-name=memory_rss]")
    expect(memory).to_have_attribute("data-x", "wall")
    expect(memory).to_have_attribute("data-x-ticks", re.compile(r"[A-Z][a-z]{2} \d"))
    days = _ticks(page, "memory_rss")
    assert len(set(days)) == len(days) >= 2, days
    assert all(re.fullmatch(r"[A-Z][a-z]{2} \d{1,2}( \d\d:\d\d)?", t) for t in days), days
    shot(page, "charts-3d-wall")
    page.select_option("#tp-x", "relative")
    loss = page.locator(".tp-chart[data-name=loss]")
    expect(loss).to_have_attribute("data-x", "relative")
    spans = _ticks(page, "loss")
    assert spans and all(re.fullmatch(r"\d+ (s|min|h|d)( \d+ (s|min|h))?", t) for t in spans), spans
    assert any(t.endswith(" d") or " d " in t for t in spans), spans
    shot(page, "charts-3d-relative")


def test_every_page_of_the_tour_is_reachable_from_the_navigation_bar(page, console, db: Database) -> None:
    from playwright.sync_api import expect

    add_user(db, "root", "admin", password="root-pw")
    _login(page, console["url"], "root", "root-pw")
    expect(page.locator("header nav")).to_be_visible()
    shot(page, "home")
    links = page.locator("header nav a")
    targets = {links.nth(i).inner_text(): links.nth(i).get_attribute("href") for i in range(links.count())}
    assert set(targets) >= {"Jobs", "Submit", "Fleets", "Teams", "Usage", "API tokens", "Plugins"}, targets
    for label in targets:
        with page.expect_response(lambda r: r.request.resource_type == "document") as answer:
            page.locator("header nav a", has_text=label).first.click()
        assert answer.value.ok, (label, answer.value.status)
        expect(page.locator("header nav a[aria-current=page]")).to_have_text(label)
        shot(page, label.lower().replace(" ", "-"))


def test_jobs_page_has_a_team_column_and_filter(page, console, db: Database) -> None:
    from playwright.sync_api import expect

    alice = add_user(db, "alice", password="alice-pw")
    own, team_job = make_job(db, alice), make_job(db, alice)
    team_id = db.call("create_team", alice, "vision")[0]["id"]
    db.fetch_one("UPDATE jobs SET team_id = %s WHERE id = %s RETURNING id", (team_id, team_job))
    _login(page, console["url"], "alice", "alice-pw")
    page.goto(f"{console['url']}/jobs")
    headers = page.locator("#jobs-table thead th").all_inner_texts()
    team_column = headers.index("Team")
    rows = {
        int(cells[1]): cells[team_column]
        for cells in (r.locator("td").all_inner_texts() for r in page.locator("#jobs-table tbody tr").all())
    }
    assert rows == {own: "alice", team_job: "vision"}, rows
    shot(page, "jobs-teams")
    page.select_option("#job-filters select[name=team]", "vision")
    expect(page).to_have_url(re.compile(r"team=vision"))
    expect(page.locator("#jobs-table tbody tr")).to_have_count(1)
    expect(page.locator("#jobs-table tbody tr td").nth(team_column)).to_have_text("vision")
    shot(page, "jobs-team-filter")


def test_the_fleets_overview_sums_up_each_fleet_and_its_row_opens_the_fleets_own_page(
    page, console, db: Database
) -> None:
    """/fleets is an overview (a row per fleet, no node table); the fleet's name opens /fleets/<name>, the
    detail with its nodes; the navigation bar reaches the overview and marks Fleets on both."""
    from playwright.sync_api import expect

    add_user(db, "root", "admin", password="root-pw")
    one_local_fleet(db, "local", gpus=2)
    one_local_fleet(db, "spare")
    _login(page, console["url"], "root", "root-pw")
    page.locator("header nav a", has_text="Fleets").click()
    expect(page).to_have_url(re.compile(r"/fleets$"))
    expect(page.locator("h1")).to_have_text("Fleets")
    rows = page.locator("#fleets-overview tbody tr")
    expect(rows).to_have_count(2)
    local = page.locator('#fleets-overview tr[data-fleet="local"]')
    expect(local.locator("td[data-cell=nodes]")).to_have_text("1 / 1")
    expect(local.locator("td[data-cell=gpus]")).to_have_text("2 / 2")
    expect(local.locator("td[data-cell=running]")).to_have_text("0")
    expect(local.locator("td[data-cell=waiting]")).to_have_text("0")
    expect(page.locator("table.nodes")).to_have_count(0)  # no node table on the overview
    shot(page, "fleets-overview")
    local.locator("a", has_text="local").click()
    expect(page).to_have_url(re.compile(r"/fleets/local$"))
    expect(page.locator("h1")).to_have_text("Fleet local")
    expect(page.locator("table.nodes tr[data-node=local-1]")).to_be_visible()
    expect(page.locator("#fleets-overview")).to_have_count(0)
    expect(page.locator("header nav a[aria-current]")).to_have_text("Fleets")
    shot(page, "fleet-local")
    page.locator(".breadcrumb a", has_text="All fleets").click()
    expect(page).to_have_url(re.compile(r"/fleets$"))
