"""A browser on the team page and the submit dialog (Playwright driving Debian's Chromium): a team admin
adds a member, an installation admin sets the team's quota, and the member's submit dialog shows the team
and what the job would do to the quota before confirmation. (The Usage chart for two teams:
tests/browser/test_usage_page.py.)"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.console_server import serving_console
from tests.submission_setup import add_user, one_local_fleet
from tuneplane.app.db import Database

pytestmark = pytest.mark.browser


@pytest.fixture
def server_url(db_url: str, tmp_path: Path, port: int) -> Iterator[str]:
    with serving_console(db_url, tmp_path, port) as url:
        yield url


def _log_in(page, server_url: str, name: str, then: str) -> None:
    from playwright.sync_api import expect

    page.context.clear_cookies()
    page.goto(f"{server_url}{then}")
    page.fill("#username", name)
    page.fill("#password", f"{name}-pw")
    page.click("button[type=submit]")
    expect(page).to_have_url(re.compile(re.escape(then) + "$"))


def test_admin_adds_member_installation_admin_sets_quota_dialog_shows_the_effect(
    page, server_url: str, db: Database
) -> None:
    from playwright.sync_api import expect

    one_local_fleet(db, gpus=4)
    add_user(db, "root", "admin", password="root-pw")
    alice = add_user(db, "alice", password="alice-pw")
    add_user(db, "carol", password="carol-pw")
    db.call("create_team", alice, "vision")

    # The team's admin adds carol as a member.
    _log_in(page, server_url, "alice", "/teams/vision")
    page.fill("#member-username", "carol")
    page.select_option("#member-role", "member")
    page.click("#member-form button[type=submit]")
    expect(page.locator("#team-members tr[data-user=carol] [data-cell=role]")).to_have_text("member")
    expect(page.locator("#quota-form")).to_have_count(0)  # quotas are the installation admin's

    # An installation admin sets the team's quota on the fleet; the gauge shows it.
    _log_in(page, server_url, "root", "/teams/vision")
    page.select_option("#quota-fleet", "local")
    page.fill("#quota-guaranteed", "2")
    page.fill("#quota-limit", "4")
    page.click("#quota-form button[type=submit]")
    row = page.locator("#team-quotas tr[data-fleet=local]")
    expect(row.locator("[data-cell=guaranteed]")).to_have_text("2")
    expect(row.locator("[data-cell=limit]")).to_have_text("4")
    expect(row.locator("meter.tp-gauge")).to_have_count(1)

    # carol's dialog: the team she picks, and what the job does to its quota, before confirming.
    _log_in(page, server_url, "carol", "/submit")
    page.select_option("#team", "vision")
    page.check("input[name=input_kind][value=recipe]")
    page.select_option("#recipe-name", "demo")
    page.select_option("#fleet", "local")
    page.fill("#gpus", "1")
    page.fill("#memory", "512M")
    page.click("#preview-button")
    preview = page.locator("#preview-result")
    expect(preview.locator("[data-summary=team]")).to_have_text("vision")
    expect(preview.locator("#quota-effect")).to_have_text(
        "Quota: team vision uses 0 of its 2 guaranteed GPUs on fleet local (limit 4); this job asks 1: "
        "1 of 2 guaranteed with it: within the guarantee"
    )
    expect(page.locator("#confirm-button")).to_be_visible()
