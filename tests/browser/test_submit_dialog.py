"""A browser (Playwright driving Debian's Chromium) logs in, fills the submission dialog, sees the preview
summary, confirms, and lands on the job page. Screenshots of each step go to $TUNEPLANE_SCREENSHOT_DIR."""

from __future__ import annotations

import os
import re
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from werkzeug.serving import make_server

from tests.submission_setup import add_user, one_local_fleet
from tuneplane.app.db import Database
from tuneplane.app.web import create_app

pytestmark = pytest.mark.browser


@pytest.fixture
def server_url(db_url: str, db: Database, tmp_path: Path, port: int) -> Iterator[str]:
    one_local_fleet(db)
    add_user(db, "alice", password="alice-pw")
    app = create_app(db_url, config={"TP_DATA_DIR": str(tmp_path / "data"), "SECRET_KEY": "test"})
    server = make_server("127.0.0.1", port, app, threaded=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{port}"
    server.shutdown()
    thread.join(10)


def shot(page, name: str) -> None:
    folder = os.environ.get("TUNEPLANE_SCREENSHOT_DIR")
    if folder:
        Path(folder).mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(Path(folder) / f"submit-{name}.png"), full_page=True)


def test_login_fill_preview_confirm_and_land_on_the_job_page(page, server_url: str, db: Database) -> None:
    from playwright.sync_api import expect

    page.goto(f"{server_url}/submit")
    expect(page).to_have_url(re.compile(r"/login"))
    page.fill("#username", "alice")
    page.fill("#password", "alice-pw")
    shot(page, "1-login")
    page.click("button[type=submit]")
    expect(page).to_have_url(re.compile(r"/submit$"))

    page.check("input[name=input_kind][value=recipe]")
    page.select_option("#recipe-name", "demo")
    page.fill("#recipe-params", "steps=30")
    page.fill("#gpus", "0")
    page.fill("#memory", "512M")
    shot(page, "2-dialog")
    page.click("#preview-button")
    preview = page.locator("#preview-result")
    expect(preview).to_have_attribute("data-preview-id", re.compile(r"^[0-9a-f-]{36}$"))
    expect(preview.locator("[data-summary=fleet]")).to_contain_text("local")
    expect(preview.locator("[data-summary=backend]")).to_have_text("node")
    expect(preview.locator("[data-summary=gpus]")).to_contain_text("0 GPUs")
    expect(preview.locator(".digest")).to_have_text(re.compile(r"^[0-9a-f]{64}$"))
    shot(page, "3-preview")

    # Editing any field discards the preview: nothing stale can be confirmed.
    page.fill("#recipe-params", "steps=40")
    expect(page.locator("#preview-result")).to_have_count(0)
    page.click("#preview-button")
    expect(page.locator("#preview-result [data-summary=fleet]")).to_contain_text("local")

    # A refused preview names the field inside the dialog.
    page.fill("#memory", "lots")
    page.click("#preview-button")
    expect(page.locator(".preview-refused [data-field='resources.memory_per_node']")).to_be_visible()
    shot(page, "4-refused")
    page.fill("#memory", "512M")
    page.click("#preview-button")
    expect(page.locator("#confirm-button")).to_be_visible()

    page.dblclick("#confirm-button")  # a double click makes one job
    expect(page).to_have_url(re.compile(r"/jobs/\d+$"))
    expect(page.locator("#job-state")).to_have_text("queued")
    expect(page.locator("#job-reason")).to_contain_text("waiting for resources")
    shot(page, "5-job")
    assert db.fetch_one("SELECT count(*) AS n FROM jobs")["n"] == 1
    job = db.fetch_one("SELECT spec FROM jobs")
    assert job["spec"]["input"]["params"]["steps"] == 40


def test_the_dialog_takes_outputs_and_an_input_chosen_from_complete_artifacts(
    page, server_url: str, db: Database, tmp_path: Path
) -> None:
    from playwright.sync_api import expect

    from tests.artifact_fixtures import make_member, recorded_complete, write_tree

    alice = db.fetch_one("SELECT id FROM users WHERE username = 'alice'")["id"]
    fleet = db.fetch_one("SELECT id FROM fleets WHERE name = 'local'")["id"]
    setup = make_member(db, user_id=alice, fleet_id=fleet, node_id=None, fleet="local")
    manifest = write_tree(tmp_path / "ckpt", {"model.npz": b"weights"})
    art = recorded_complete(db, setup, "checkpoint.2", manifest, kind="checkpoint")
    assert art["state"] == "complete"

    page.goto(f"{server_url}/login")
    page.fill("#username", "alice")
    page.fill("#password", "alice-pw")
    page.click("button[type=submit]")
    page.goto(f"{server_url}/submit")
    page.check("input[name=input_kind][value=recipe]")
    page.select_option("#recipe-name", "demo")
    page.fill("#gpus", "0")
    page.fill("#memory", "512M")
    page.select_option("#fleet", "local")
    page.fill("#outputs", "ckpt=checkpoint\nlogs-copy=logs:object")
    page.select_option("#input-0-artifact", f"sha256:{manifest.digest}")
    page.fill("#input-0-name", "base")
    shot(page, "6-outputs-inputs")
    page.click("#preview-button")
    preview = page.locator("#preview-result")
    expect(preview.locator("[data-summary=input-artifact]")).to_contain_text(
        f"checkpoint.2 of job {setup.job_id}"
    )
    expect(preview.locator("[data-summary=output]").first).to_contain_text("ckpt: checkpoint")
    expect(preview.locator("[data-summary=output]").nth(1)).to_contain_text("delivery object")
    page.click("#confirm-button")
    expect(page).to_have_url(re.compile(r"/jobs/\d+$"))
    job = db.fetch_one("SELECT spec FROM jobs WHERE owner_id = %s ORDER BY id DESC LIMIT 1", (alice,))
    assert [o["name"] for o in job["spec"]["outputs"]] == ["ckpt", "logs-copy"]
    (pinned,) = job["spec"]["inputs"]
    assert pinned["name"] == "base" and pinned["manifest_digest"] == manifest.digest


def test_the_preemptible_box_agrees_with_the_preview(page, server_url: str, db: Database) -> None:
    """A normal job is preemptible by default: the box starts checked, as the preview says; unchecked, the
    preview says not preemptible; choosing the class `high` unchecks it (that class's default)."""
    from playwright.sync_api import expect

    page.goto(f"{server_url}/submit")
    page.fill("#username", "alice")
    page.fill("#password", "alice-pw")
    page.click("button[type=submit]")
    page.check("input[name=input_kind][value=recipe]")
    page.select_option("#recipe-name", "demo")
    page.fill("#gpus", "0")
    page.fill("#memory", "512M")
    expect(page.locator("#preemptible")).to_be_checked()
    page.click("#preview-button")
    summary = page.locator("#preview-result [data-summary=preemption]")
    expect(summary).to_have_text(re.compile(r"^preemptible"))
    shot(page, "preemptible-checked")

    page.uncheck("#preemptible")
    page.click("#preview-button")
    expect(summary).to_have_text(re.compile(r"^not preemptible"))
    shot(page, "preemptible-unchecked")

    page.check("#preemptible")
    page.fill("#priority", "high")
    page.dispatch_event("#priority", "change")
    expect(page.locator("#preemptible")).not_to_be_checked()
    page.fill("#priority", "low")
    page.dispatch_event("#priority", "change")
    expect(page.locator("#preemptible")).to_be_checked()
    page.click("#preview-button")
    expect(summary).to_have_text(re.compile(r"^preemptible"))
