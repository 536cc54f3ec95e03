"""A browser (Playwright driving Debian's Chromium) watches a running job's page: log lines appear in the
member's pane as the node ships them, the state and the events follow the job live (htmx), and Cancel
stops a queued job. Screenshots go to $TUNEPLANE_SCREENSHOT_DIR."""

from __future__ import annotations

import os
import re
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from werkzeug.serving import make_server

from tests.launch_fixtures import report, run_to_running
from tests.submission_setup import add_user, one_local_fleet
from tuneplane.app.db import Database
from tuneplane.app.submission import service
from tuneplane.app.web import create_app

pytestmark = pytest.mark.browser

DEMO = {"recipe": {"name": "demo", "params": {"steps": 5}}}


@pytest.fixture
def setup(db_url: str, db: Database, tmp_path: Path, port: int) -> Iterator[dict]:
    fleet = one_local_fleet(db)
    alice = add_user(db, "alice", password="alice-pw")
    app = create_app(db_url, config={"TP_DATA_DIR": str(tmp_path / "data"), "SECRET_KEY": "test"})
    server = make_server("127.0.0.1", port, app, threaded=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield {"url": f"http://127.0.0.1:{port}", "fleet": fleet, "alice": alice}
    server.shutdown()
    thread.join(10)


def shot(page, name: str) -> None:
    folder = os.environ.get("TUNEPLANE_SCREENSHOT_DIR")
    if folder:
        Path(folder).mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(Path(folder) / f"job-{name}.png"), full_page=True)


def submit(db: Database, user: int, key: str) -> int:
    preview = service.create_preview(db, user, DEMO)
    return service.confirm(db, user, preview["id"], preview["digest"], key)["job_id"]


def test_logs_state_and_events_follow_a_running_job_and_cancel_stops_a_queued_one(
    page, setup: dict, db: Database
) -> None:
    from playwright.sync_api import expect

    expect.set_options(timeout=15_000)
    job_id = submit(db, setup["alice"], "k1")
    db.call("reserve_next", setup["fleet"], 1000)
    (member,) = run_to_running(db, job_id)
    report(db, "member_log", member, stream="stdout", offset=0, text="step 1 <b>loss</b> 0.9\n")

    page.goto(f"{setup['url']}/jobs/{job_id}")
    page.fill("#username", "alice")
    page.fill("#password", "alice-pw")
    page.click("button[type=submit]")
    expect(page).to_have_url(re.compile(rf"/jobs/{job_id}$"))
    expect(page.locator("#job-state")).to_have_text("running")
    expect(page.locator("#job-members")).to_contain_text("local-1")
    pane = page.locator("#log-0-stdout")
    expect(pane).to_have_text("step 1 <b>loss</b> 0.9\n")  # shown as text, never as markup

    report(db, "member_log", member, stream="stdout", offset=23, text="step 2 loss 0.5\n")
    report(db, "member_log", member, stream="stderr", offset=0, text="a warning\n")
    expect(pane).to_have_text("step 1 <b>loss</b> 0.9\nstep 2 loss 0.5\n")
    expect(page.locator("#log-0-stderr")).to_have_text("a warning\n")
    shot(page, "1-running")

    report(db, "member_exited", member, exit_code=0)
    expect(page.locator("#job-state")).to_have_text("succeeded")
    expect(page.locator("#job-events")).to_contain_text("exited with status 0")
    expect(page.locator("#job-live")).not_to_have_attribute("hx-trigger", re.compile("."))
    # Nothing was appended twice while the panes kept polling.
    expect(pane).to_have_text("step 1 <b>loss</b> 0.9\nstep 2 loss 0.5\n")
    shot(page, "2-succeeded")

    queued = submit(db, setup["alice"], "k2")
    page.goto(f"{setup['url']}/jobs/{queued}")
    expect(page.locator("#job-waiting")).to_contain_text("1st in queue")
    page.once("dialog", lambda dialog: dialog.accept())
    page.fill("input[name=reason]", "not needed")
    page.click("text=Cancel job")
    expect(page.locator("#job-state")).to_have_text("cancelled")
    expect(page.locator("#job-events")).to_contain_text("not needed")
    shot(page, "3-cancelled")
