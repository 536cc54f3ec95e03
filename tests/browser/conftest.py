"""The browser tests' Chromium page (Playwright driving Debian's Chromium). Every page a test opens is
watched for Content-Security-Policy violations (app/web/limits.py): a test that caused one fails, so the
whole browser suite checks that the console works under its CSP (htmx, uPlot, static/console.js)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


@pytest.fixture
def page():
    if not Path(CHROMIUM).exists() and not shutil.which("chromium"):
        pytest.skip("Debian's chromium is not installed (.ci/run installs it)")
    from playwright.sync_api import sync_playwright

    violations: list[str] = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        context = browser.new_context(viewport={"width": 1280, "height": 900})
        page = context.new_page()
        page.on(
            "console",
            lambda message: (
                violations.append(message.text) if "Content Security Policy" in message.text else None
            ),
        )
        yield page
        context.close()
        browser.close()
    assert not violations, "the page broke its Content-Security-Policy:\n" + "\n".join(violations[:10])
