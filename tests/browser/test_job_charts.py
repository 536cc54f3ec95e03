"""Job Charts in a browser (Playwright driving Debian's Chromium): two jobs compared on one chart, picked on
the jobs list, log scale and smoothing toggled, and the CSV export holding exactly the plotted series;
a series with NaN is still drawn and the page lists what could not be stored."""

from __future__ import annotations

import csv
import io
import json
import math
import re
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
from werkzeug.serving import make_server

from tests.browser.test_job_page_live import shot
from tests.submission_setup import add_user
from tests.telemetry_support import make_job, member_token, running_gateway
from tuneplane.app.db import Database
from tuneplane.app.telemetry import wire
from tuneplane.app.web import create_app

pytestmark = pytest.mark.browser


@pytest.fixture
def setup(db_url: str, db: Database, tmp_path: Path, port: int) -> Iterator[dict]:
    alice = add_user(db, "alice", password="alice-pw")
    app = create_app(db_url, config={"TP_DATA_DIR": str(tmp_path / "data"), "SECRET_KEY": "test"})
    server = make_server("127.0.0.1", port, app, threaded=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    with running_gateway(db_url) as gateway:
        yield {"url": f"http://127.0.0.1:{port}", "alice": alice, "gateway": gateway}
    server.shutdown()
    thread.join(10)


def _send(gateway, token: str, series: list[tuple[str, str, list[int], list[float]]], **kw) -> None:
    steps = [s for _, _, st, _ in series for s in st]
    values = [v for _, _, _, vs in series for v in vs]
    payload = wire.encode(
        "c1",
        1,
        [(src, n, len(st)) for src, n, st, _ in series],
        steps,
        values,
        [1.7e9 + s for s in steps],
        **kw,
    )
    response = httpx.post(
        f"{gateway.url}/v1/telemetry/batches", content=payload, headers={"Authorization": f"Bearer {token}"}
    )
    assert response.status_code == 200, response.text


def test_two_jobs_compared_log_scale_smoothing_and_csv_export(
    page,  # the shared fixture of tests/browser/conftest.py
    setup: dict,
    db: Database,
) -> None:
    from playwright.sync_api import expect

    expect.set_options(timeout=15_000)
    jobs = [make_job(db, setup["alice"]) for _ in range(2)]
    rng = np.random.default_rng(5)
    for k, job in enumerate(jobs):
        steps = list(range(3000))
        loss = [float(2.0 / (1 + s / 300) + 0.05 * rng.random() + k) for s in steps]
        series = [("jsonl:metrics.jsonl", "train/loss", steps, loss)]
        if k == 0:  # a second source of the same member: the legend tells them apart
            series.append(("tensorboard:run", "loss", steps[:100], [math.nan] * 50 + loss[50:100]))
        damage = [("tensorboard:run", "run/events.out.tfevents.1", 99, 40, "record data fails its CRC")]
        _send(setup["gateway"], member_token(db, job), series, damage=damage if k == 0 else None)

    page.goto(f"{setup['url']}/jobs")
    page.fill("#username", "alice")
    page.fill("#password", "alice-pw")
    page.click("button[type=submit]")
    for job in jobs:
        page.check(f"input[name=jobs][value='{job}']")
    page.click("text=Compare")
    expect(page).to_have_url(re.compile(r"/charts/compare\?jobs="))
    chart = page.locator(".tp-chart[data-name=loss]")
    # Job 0's TensorBoard copy of its loss is not a line of its own: the JSONL copy is drawn, naming it.
    expect(chart).to_have_attribute("data-drawn", "linear:0:2")
    legend = chart.locator(".u-legend")
    expect(legend).to_contain_text(
        f"job {jobs[0]} · attempt 1 · member 0 · jsonl:metrics.jsonl (also tensorboard:run) · train/loss"
    )
    expect(legend).to_contain_text(f"job {jobs[1]} · attempt 1 · member 0 · jsonl:metrics.jsonl · train/loss")
    shot(page, "charts-compare")

    page.check("#tp-log")
    expect(chart).to_have_attribute("data-drawn", "log:0:2")
    page.fill("#tp-smooth", "200")
    page.dispatch_event("#tp-smooth", "change")
    expect(chart).to_have_attribute("data-drawn", "log:200:2")
    shot(page, "charts-log-smoothed")

    card = page.locator(".tp-chart-card", has=chart)
    with page.expect_download() as download:
        card.locator("[data-export=csv]").click()
    text = Path(download.value.path()).read_text()
    rows = list(csv.reader(io.StringIO(text)))
    header, body = rows[0], rows[1:]
    # Exactly what is plotted: job 1's smoothed line, from the same bounded endpoint the chart read.
    api = httpx.get(
        f"{setup['url']}/jobs/{jobs[1]}/metrics",
        params={"name": "loss", "max_points": 500, "smooth": 200},
        headers={"Accept": "application/json"},
        cookies={c["name"]: c["value"] for c in page.context.cookies()},
    ).json()
    (series,) = api["series"]
    column = header.index(
        f"job {jobs[1]} · attempt 1 · member 0 · jsonl:metrics.jsonl · train/loss (smoothed 200)"
    )
    plotted = {int(r[0]): float(r[column]) for r in body if r[column]}
    assert plotted == {b["last_step"]: b["smoothed"] for b in series["buckets"]}
    assert len(plotted) == len(series["buckets"]) >= 400

    # Relative time: every series starts at 0 s (its buckets' wall times, kept in the rollups).
    page.select_option("#tp-x", "relative")
    expect(chart).to_have_attribute("data-x", "relative")
    with page.expect_download() as download:
        card.locator("[data-export=json]").click()
    exported = json.loads(Path(download.value.path()).read_text())
    assert exported["columns"][0] == "time since start" and exported["rows"][0][0] == 0

    # The JSON answer of a diverged series is valid JSON, and the page lists what could not be stored.
    raw = httpx.get(
        f"{setup['url']}/jobs/{jobs[0]}/metrics",
        params={"name": "loss", "max_points": 1000},
        headers={"Accept": "application/json"},
        cookies={c["name"]: c["value"] for c in page.context.cookies()},
    )
    json.loads(raw.text)  # bare NaN would fail here
    assert any(b["non_finite"] == "NaN" for s in raw.json()["series"] for b in s["buckets"])
    page.goto(f"{setup['url']}/jobs/{jobs[0]}/charts")
    expect(page.locator(".tp-damaged")).to_contain_text("run/events.out.tfevents.1 at byte 99, 40 bytes")
    expect(page.locator(".tp-chart[data-name=loss]")).to_have_attribute("data-drawn", "linear:0:1")
