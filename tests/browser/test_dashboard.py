"""Issue 15 point 9 in a browser: the home page is a dashboard (my recent jobs with state and reason, the
fleets with connected nodes and free GPUs, a Submit button); the jobs list filters by state, owner and
fleet and pages; the Job Charts page draws with uPlot. The conftest's page fails on any CSP violation."""

from __future__ import annotations

import re
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from werkzeug.serving import make_server

from tests.launch_fixtures import make_job
from tests.submission_setup import add_fleet, add_node, add_user
from tuneplane.app.db import Database
from tuneplane.app.web import create_app

pytestmark = pytest.mark.browser


@pytest.fixture
def console(db_url: str, db: Database, tmp_path: Path, port: int) -> Iterator[dict]:
    local, gpu = add_fleet(db, "local"), add_fleet(db, "gpu")
    add_node(db, local, "local-1")
    add_node(db, gpu, "gpu-1", gpus=4)
    admin = add_user(db, "root", role="admin", password="root-pw")
    bob = add_user(db, "bob")
    jobs = {"root-local": [make_job(db, admin, local, gpus_per_node=0) for _ in range(55)]}
    jobs["bob-gpu"] = [make_job(db, bob, gpu) for _ in range(3)]
    app = create_app(db_url, config={"TP_DATA_DIR": str(tmp_path / "data"), "SECRET_KEY": "test"})
    server = make_server("127.0.0.1", port, app, threaded=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield {"url": f"http://127.0.0.1:{port}", "jobs": jobs}
    server.shutdown()
    thread.join(10)


def test_dashboard_filters_and_paging(page, console: dict) -> None:
    from playwright.sync_api import expect

    url = console["url"]
    page.goto(url + "/")
    expect(page.locator("a.button", has_text="Log in")).to_be_visible()
    page.goto(url + "/login")
    page.fill("#username", "root")
    page.fill("#password", "root-pw")
    page.click("button[type=submit]")
    expect(page).to_have_url(url + "/")

    # The dashboard: my recent jobs with state and reason, fleets with connected nodes and free GPUs.
    jobs = page.locator("#dashboard-jobs tbody tr")
    expect(jobs).to_have_count(8)
    expect(jobs.first).to_contain_text(str(console["jobs"]["root-local"][-1]))
    expect(jobs.first).to_contain_text("queued")
    fleets = page.locator("#dashboard-fleets tbody tr")
    expect(fleets).to_have_count(2)
    gpu_row = fleets.filter(has_text="gpu")
    expect(gpu_row.locator("td").nth(1)).to_contain_text("1 of 1")
    expect(gpu_row.locator("td").nth(2)).to_have_text("4")
    page.click("#dashboard-submit")
    expect(page).to_have_url(re.compile(r"/submit$"))

    # The jobs list filters by owner, fleet and state (each select applies at once) and pages.
    page.goto(url + "/jobs")
    rows = page.locator("#jobs-table tbody tr")
    expect(rows).to_have_count(50)
    page.select_option("select[name=owner]", "bob")
    expect(page).to_have_url(re.compile(r"owner=bob"))
    expect(rows).to_have_count(3)
    expect(rows.first).to_contain_text("bob")
    page.select_option("select[name=fleet]", "local")
    expect(page).to_have_url(re.compile(r"fleet=local"))
    expect(rows).to_have_count(1)
    expect(rows.first).to_contain_text("No jobs match")
    page.goto(url + "/jobs?owner=root&state=queued")
    expect(rows).to_have_count(50)
    page.click("a[rel=next]")
    expect(page).to_have_url(re.compile(r"before=\d+"))
    expect(rows).to_have_count(5)
    expect(page.locator("a[rel=next]")).to_have_count(0)
    expect(rows.first.locator("td").nth(8)).to_have_text("0 B")  # memory for people (after the Team column)

    # The Job Charts page loads uPlot and its script under the CSP.
    page.goto(url + f"/jobs/{console['jobs']['root-local'][0]}/charts")
    expect(page.locator("h1")).to_contain_text("charts")
    page.wait_for_load_state("networkidle")


def test_htmx_keeps_the_csp_even_when_console_js_never_loads(page, console: dict) -> None:
    """htmx's settings live in the page, not in console.js: a page whose console.js did not arrive (a
    navigation that stopped it between the two scripts, as a CI run once did) must not get htmx's inline
    <style>. The conftest's page fails on the violation; the head is checked too."""
    from playwright.sync_api import expect

    page.route("**/static/console.js*", lambda route: route.abort())
    page.goto(console["url"] + "/login")
    expect(page.locator("#username")).to_be_visible()
    page.wait_for_load_state("load")
    page.wait_for_function("() => window.htmx !== undefined && document.readyState === 'complete'")
    assert page.evaluate("() => document.head.querySelectorAll('style').length") == 0
    assert page.evaluate("() => htmx.config.allowEval") is False
