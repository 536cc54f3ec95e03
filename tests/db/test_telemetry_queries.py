"""Bounded metric queries: rollups agree with raw points, raw pages are exact, readers see only their jobs,
canonical names, retention, the charts page and `tuneplane metrics`."""

from __future__ import annotations

import json
import math
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import httpx
import numpy as np
import pytest
from click.testing import CliRunner
from werkzeug.serving import make_server

from tests.telemetry_support import (
    GatewayThread,
    make_job,
    make_user,
    member_token,
    running_gateway,
    user_api_token,
)
from tuneplane.app.db import Database
from tuneplane.app.telemetry import wire


@pytest.fixture
def gateway(db_url: str) -> Iterator[GatewayThread]:
    with running_gateway(db_url) as gw:
        yield gw


def _send(
    gateway: GatewayThread, token: str, name: str, steps, values, *, seq: int, source: str = "jsonl:m"
) -> None:
    steps = np.asarray(steps, dtype=np.int64)
    payload = wire.encode(f"c-{name}", seq, [(source, name, len(steps))], steps, values, np.zeros(len(steps)))
    response = httpx.post(
        f"{gateway.url}/v1/telemetry/batches",
        content=payload,
        headers={"Authorization": f"Bearer {token}"},
        timeout=60,
    )
    assert response.status_code == 200, response.text


def _series_id(db: Database, job: int, name: str, attempt: int = 1) -> int:
    return db.fetch_one(
        "SELECT id FROM telemetry_series WHERE job_id = %s AND name = %s AND attempt = %s",
        (job, name, attempt),
    )["id"]


def _buckets(db: Database, series: int, n: int, rollups: bool, lo=None, hi=None) -> list[dict]:
    return db.fetch_all(
        "SELECT * FROM telemetry_series_buckets(%s, %s, %s, %s, %s)", (series, n, lo, hi, rollups)
    )


def test_rollup_buckets_equal_raw_aggregation(db: Database, gateway: GatewayThread) -> None:
    job = make_job(db, make_user(db, "alice"))
    token = member_token(db, job)
    rng = np.random.default_rng(3)
    values = rng.normal(size=64_000)
    # Sent in uneven batches so rollup rows are merged across batches.
    for seq, (a, b) in enumerate([(0, 10_001), (10_001, 40_000), (40_000, 64_000)], start=1):
        _send(gateway, token, "loss", range(a, b), values[a:b], seq=seq)
    series = _series_id(db, job, "loss")
    fast = _buckets(db, series, 1000, True)
    slow = _buckets(db, series, 1000, False)
    assert len(fast) == len(slow) == 1000
    for f, s in zip(fast, slow, strict=True):
        assert (f["bucket_start"], f["bucket_end"], f["n"], f["last_step"]) == (
            s["bucket_start"],
            s["bucket_end"],
            s["n"],
            s["last_step"],
        )
        assert f["min"] == s["min"] and f["max"] == s["max"] and f["last_value"] == s["last_value"]
        assert f["mean"] == pytest.approx(s["mean"], rel=1e-9, abs=1e-12)
    coarse = _buckets(db, series, 10, True)
    assert len(coarse) <= 10 and sum(b["n"] for b in coarse) == 64_000
    assert min(b["min"] for b in coarse) == values.min() and coarse[-1]["last_value"] == values[-1]


def test_non_finite_values_stay_out_of_min_max_mean(db: Database, gateway: GatewayThread) -> None:
    job = make_job(db, make_user(db, "alice"))
    token = member_token(db, job)
    _send(gateway, token, "loss", range(128), [math.nan if s % 2 else float(s) for s in range(128)], seq=1)
    series = _series_id(db, job, "loss")
    for rollups in (True, False):
        (bucket,) = _buckets(db, series, 1, rollups)
        assert (bucket["min"], bucket["max"], bucket["n"]) == (0.0, 126.0, 64)
        assert math.isnan(bucket["last_value"])


def test_raw_inspector_pages_exact_points_by_step(db: Database, gateway: GatewayThread) -> None:
    from tuneplane.app.telemetry.queries import raw_page

    owner = make_user(db, "alice")
    job = make_job(db, owner)
    token = member_token(db, job)
    steps = [s // 2 for s in range(2_000)]  # every step twice: page edges fall inside a step
    _send(gateway, token, "loss", steps, [float(i) for i in range(2_000)], seq=1)
    series = _series_id(db, job, "loss")
    seen, cursor = [], {"step_from": 100, "skip": 0}
    while cursor:
        page = raw_page(
            db, owner, series, step_from=cursor["step_from"], step_to=599, limit=333, skip=cursor["skip"]
        )
        assert len(page["points"]) <= 333
        seen.extend((p["step"], p["value"]) for p in page["points"])
        cursor = page["next"]
    assert seen == [(i // 2, float(i)) for i in range(200, 1_200)]


def test_users_read_only_their_own_jobs_metrics(db: Database, db_url: str, gateway: GatewayThread) -> None:
    from tuneplane.app.web import create_app

    alice, bob, admin = make_user(db, "alice"), make_user(db, "bob"), make_user(db, "root", "admin")
    job = make_job(db, alice)
    _send(gateway, member_token(db, job), "train/loss", range(5_000), np.linspace(1, 0, 5_000), seq=1)
    client = create_app(db_url).test_client()

    def get(user: int, path: str):
        return client.get(
            path,
            headers={"Authorization": f"Bearer {user_api_token(db, user)}", "Accept": "application/json"},
        )

    mine = get(alice, f"/jobs/{job}/metrics?max_points=100")
    assert mine.status_code == 200
    (series,) = mine.json["series"]
    assert series["canonical"] == "loss" and 0 < len(series["buckets"]) <= 100
    assert get(admin, f"/jobs/{job}/metrics").status_code == 200
    theirs = get(bob, f"/jobs/{job}/metrics")
    assert theirs.status_code == 404 and theirs.json["fields"] == {"job_id": theirs.json["error"]}
    assert get(bob, f"/jobs/{job}/metrics/raw?series={series['id']}").status_code == 404
    assert get(alice, f"/jobs/{job}/metrics?max_points=1001").status_code == 400
    raw = get(alice, f"/jobs/{job}/metrics/raw?series={series['id']}&limit=10&step_from=20")
    assert [p["step"] for p in raw.json["points"]] == list(range(20, 30))


def test_charts_page_serves_uplot_from_static_and_lists_series(
    db: Database, db_url: str, gateway: GatewayThread
) -> None:
    from tuneplane.app.web import create_app

    alice = make_user(db, "alice")
    job = make_job(db, alice)
    token = member_token(db, job)
    _send(gateway, token, "train/loss", range(100), np.ones(100), seq=1)
    _send(gateway, token, "custom_metric", range(10), np.ones(10), seq=2)
    client = create_app(db_url).test_client()
    headers = {"Authorization": f"Bearer {user_api_token(db, alice)}"}
    page = client.get(f"/jobs/{job}/charts", headers=headers)
    html = page.get_data(as_text=True)
    assert page.status_code == 200
    assert "uPlot.iife.min.js" in html and "cdn" not in html.lower()
    assert f"/jobs/{job}/metrics?name=loss" in html and "custom_metric" in html
    assert 'hx-trigger="every 5s"' in html  # the job is running: live refresh
    assert client.get("/static/uPlot.iife.min.js").status_code == 200
    tick = client.get(f"/jobs/{job}/charts/tick", headers=headers)
    assert tick.status_code == 200 and "data-version=" in tick.get_data(as_text=True)


def test_canonical_names_map_common_framework_names(db: Database) -> None:
    cases = {
        "loss": "loss",
        "train/loss": "loss",
        "Loss/train": "loss",
        "train_loss": "loss",
        "eval/loss": "eval_loss",
        "val_loss": "eval_loss",
        "eval_loss": "eval_loss",
        "lr": "learning_rate",
        "train/learning_rate": "learning_rate",
        "lr-AdamW": "learning_rate",
        "train_samples_per_second": "throughput",
        "throughput": "throughput",
        "tokens_per_sec": "throughput",
        "grad_norm": "grad_norm",
        "train/grad_norm": "grad_norm",
        "gpu_util": "gpu_utilization",
        "system/gpu.0.gpu": "gpu_utilization",
        "gpu/memory_used": "gpu_memory",
        "torch/max_memory_allocated": "gpu_memory",
        "kl_loss": None,
        "accuracy": None,
        # issue 11: throughput however it is spelled, add_scalars sub-runs, HF Trainer, Lightning, torchtune
        "tokens/throughput": "throughput",
        "perf/throughput/tokens": "throughput",
        "tokens_per_second_per_gpu": "throughput",
        "train_steps_per_second": "throughput",
        "samples/s": "throughput",
        "train_loss_step": "loss",
        "train_loss_epoch": "loss",
        "val/loss": "eval_loss",
        "lr-Adam/pg1": "learning_rate",
        "peak_memory_active": "gpu_memory",
        "peak_memory_reserved": "gpu_memory",
        "system/gpu.0.utilization": "gpu_utilization",
        "system/gpu.0.memory_used": "gpu_memory",
        "system/gpu.0.power_watts": "gpu_power",
        "system/cpu_percent": "cpu_utilization",
        "system/rss_bytes": "memory_rss",
        "epoch": None,
        "total_flos": None,
    }
    got = {n: db.fetch_one("SELECT telemetry_canonical(%s) AS c", (n,))["c"] for n in cases}
    assert got == cases


def test_retention_prunes_old_series_only(db: Database, gateway: GatewayThread) -> None:
    admin = make_user(db, "root", "admin")
    job = make_job(db, admin)
    _send(gateway, member_token(db, job), "loss", range(100), np.ones(100), seq=1)
    db.call("set_telemetry_settings", admin, "30 days", None, None)
    assert db.fetch_one("SELECT * FROM telemetry_prune(now() + interval '29 days')")["series"] == 0
    pruned = db.fetch_one("SELECT * FROM telemetry_prune(now() + interval '31 days')")
    assert (pruned["series"], pruned["points"]) == (1, 100)
    assert db.fetch_one("SELECT count(*) FROM telemetry_rollups")["count"] == 0


@contextmanager
def _cli_env(db_url: str, db: Database, user: int) -> Iterator[dict]:
    """The console on a free loopback port; yields the environment that points the CLI at it as `user`."""
    from tuneplane.app.web import create_app

    server = make_server("127.0.0.1", 0, create_app(db_url), threaded=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield {
            "TUNEPLANE_SERVER": f"http://127.0.0.1:{server.server_port}",
            "TUNEPLANE_TOKEN": user_api_token(db, user),
            "TUNEPLANE_CONFIG": "/nonexistent",
        }
    finally:
        server.shutdown()


def test_metrics_cli_prints_bounded_series(db: Database, db_url: str, gateway: GatewayThread) -> None:
    from tuneplane.app.cli import main

    alice = make_user(db, "alice")
    job = make_job(db, alice)
    token = member_token(db, job)
    _send(gateway, token, "loss", range(3_000), np.linspace(2, 1, 3_000), seq=1)
    damaged = wire.encode(
        "c-loss",
        2,
        [],
        [],
        [],
        [],
        damage=[("tensorboard:run", "run/events.out.tfevents.9", 512, 30, "record data fails its CRC")],
        refused=[("jsonl:m", "loss", "step outside ±(2^53-1)", 2)],
    )
    httpx.post(
        f"{gateway.url}/v1/telemetry/batches", content=damaged, headers={"Authorization": f"Bearer {token}"}
    )
    with _cli_env(db_url, db, alice) as env:
        table = CliRunner().invoke(main, ["metrics", str(job)], env=env)
        assert table.exit_code == 0, table.output
        assert "loss" in table.output and "0..2999" in table.output
        assert "collecting metrics: a1 m0 collecting" in table.output
        assert "warning: damaged region skipped: a1 m0 run/events.out.tfevents.9 at byte 512, 30 bytes" in (
            table.output
        )
        assert "warning: 2 point(s) refused: a1 m0 jsonl:m loss: step outside ±(2^53-1)" in table.output
        as_json = CliRunner().invoke(
            main, ["metrics", str(job), "--name", "loss", "--max-points", "50", "--json"], env=env
        )
        data = json.loads(as_json.output)
        assert len(data["series"][0]["buckets"]) <= 50 and data["series"][0]["point_count"] == 3_000
        refused = CliRunner().invoke(main, ["metrics", "999999"], env=env)
        assert refused.exit_code == 1 and "no job 999999 of yours" in refused.output


@pytest.mark.parametrize("points", [10_000, 100_000])
def test_a_step_far_outside_the_series_does_not_ruin_its_buckets(
    db: Database, gateway: GatewayThread, points: int
) -> None:
    job = make_job(db, make_user(db, "alice"))
    token = member_token(db, job)
    steps = [*range(points), 2**50]
    _send(gateway, token, "loss", steps, np.arange(len(steps), dtype=np.float64), seq=1)
    series = _series_id(db, job, "loss")
    buckets = _buckets(db, series, 500, True)
    assert 400 <= len(buckets) <= 500
    dense = [b for b in buckets if b["bucket_end"] < points]
    assert len(dense) >= len(buckets) - 2  # the outlier takes at most a bucket of its own
    assert max(b["bucket_end"] - b["bucket_start"] for b in dense) <= 4 * points / 500
    assert sum(b["n"] for b in buckets) == len(steps) and buckets[-1]["last_step"] == 2**50


def test_extreme_steps_stored_before_the_range_check_still_read(db: Database, gateway: GatewayThread) -> None:
    job = make_job(db, make_user(db, "alice"))
    _send(gateway, member_token(db, job), "loss", range(100), np.ones(100), seq=1)
    series = _series_id(db, job, "loss")
    db.fetch_all(
        "INSERT INTO telemetry_points VALUES (%s, -9223372036854775808, 1, 0),"
        " (%s, 9223372036854775807, 2, 0) RETURNING 1",
        (series, series),
    )
    db.fetch_all(
        "UPDATE telemetry_series SET min_step = -9223372036854775808, max_step = 9223372036854775807"
        " WHERE id = %s RETURNING 1",
        (series,),
    )
    for rollups in (True, False):
        buckets = _buckets(db, series, 1000, rollups)
        assert buckets and sum(b["n"] for b in buckets) >= 100


def test_metrics_cli_rounds_to_the_series_precision_and_shows_system_steps_as_times(
    db: Database, db_url: str, gateway: GatewayThread
) -> None:
    """Floats as written (0.005, not 0.005000000000000001); a system series' steps (epoch milliseconds) as
    the UTC times they are."""
    from tuneplane.app.cli import main

    alice = make_user(db, "alice")
    job = make_job(db, alice)
    token = member_token(db, job)
    _send(gateway, token, "lr", [0, 1, 2], np.array([0.1, 0.05, 0.1 * 0.05]), seq=1)
    start_ms = 1_796_000_000_000  # 2026-11-30 00:53:20 UTC
    _send(gateway, token, "system/cpu_percent", [start_ms, start_ms + 10_000], np.array([99.5, 110.25]),
          seq=2, source="system")  # fmt: skip
    rss = np.array([300 * 2**20, 1.5 * 2**30])
    _send(gateway, token, "system/rss_bytes", [start_ms, start_ms + 10_000], rss, seq=3, source="system")
    with _cli_env(db_url, db, alice) as env:
        table = CliRunner().invoke(main, ["metrics", str(job)], env=env)
        assert table.exit_code == 0, table.output
        lr = next(line for line in table.output.splitlines() if line.startswith("lr "))
        assert lr.split()[-3:] == ["0.005", "0.005", "0.1"], lr
        assert "0.005000000000000001" not in table.output
        cpu = next(line for line in table.output.splitlines() if line.startswith("system/cpu_percent"))
        assert "2026-11-30 00:53:20..00:53:30 UTC" in cpu and str(start_ms) not in cpu, cpu
        assert cpu.split()[-3:] == ["110.25", "99.5", "110.25"], cpu
        rss = next(line for line in table.output.splitlines() if line.startswith("system/rss_bytes"))
        assert rss.split()[-6:] == ["1.5", "GiB", "300.0", "MiB", "1.5", "GiB"], rss


def test_metrics_cli_lists_a_metric_written_twice_once_the_jsonl_copy(
    db: Database, db_url: str, gateway: GatewayThread
) -> None:
    """The demo writes its loss to JSONL and TensorBoard: one row, the JSONL copy (float64 as written), naming
    the other source, as the console's chart draws one line (queries.mark_copies); --json keeps both, the
    TensorBoard copy marked `copy_of`."""
    from tuneplane.app.cli import main

    alice = make_user(db, "alice")
    job = make_job(db, alice)
    token = member_token(db, job)
    _send(gateway, token, "loss", [0, 1, 2], np.array([2.0, 1.5, 1.25]), seq=1, source="tensorboard:run")
    _send(gateway, token, "train/loss", [0, 1, 2], np.array([2.0, 1.5, 1.25]), seq=2, source="jsonl:m")
    with _cli_env(db_url, db, alice) as env:
        table = CliRunner().invoke(main, ["metrics", str(job)], env=env)
        assert table.exit_code == 0, table.output
        rows = [line for line in table.output.splitlines() if " loss " in f" {line} "]
        assert len(rows) == 1 and rows[0].startswith("train/loss "), table.output
        assert "jsonl:m (also tensorboard:run)" in rows[0], rows[0]
        data = json.loads(CliRunner().invoke(main, ["metrics", str(job), "--json"], env=env).output)
        by_source = {s["source"]: s for s in data["series"]}
        assert by_source["tensorboard:run"]["copy_of"] == "jsonl:m"
        kept = by_source["jsonl:m"]
        assert kept["copy_of"] is None and kept["copies"] == ["tensorboard:run"]
