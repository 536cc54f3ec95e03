"""`from tuneplane import sdk; sdk.log(...)` inside a workload posts to the telemetry gateway."""

from __future__ import annotations

import subprocess
import sys

from tests.conftest import REPO
from tests.telemetry_support import make_job, make_user, member_token, running_gateway
from tuneplane.app.db import Database


def test_sdk_log_from_a_workload_process_is_stored_once(db: Database, db_url: str) -> None:
    job = make_job(db, make_user(db, "alice"))
    token = member_token(db, job, 1, 2)
    script = (
        "from tuneplane import sdk\n"
        "for step in range(250):\n"
        "    sdk.log({'loss': 1.0 / (step + 1), 'train/lr': 0.01}, step=step)\n"
    )
    with running_gateway(db_url) as gateway:
        env = {"TUNEPLANE_TELEMETRY_URL": gateway.url, "TUNEPLANE_TELEMETRY_TOKEN": token, "PATH": "/usr/bin"}
        done = subprocess.run(
            [sys.executable, "-c", script], cwd=REPO, env=env, capture_output=True, timeout=60
        )
    assert done.returncode == 0, done.stderr.decode()
    rows = db.fetch_all(
        "SELECT s.source, s.name, s.canonical, s.member_rank, p.step, p.value FROM telemetry_points p"
        " JOIN telemetry_series s ON s.id = p.series_id WHERE s.job_id = %s ORDER BY s.name, p.step",
        (job,),
    )
    loss = [(r["step"], r["value"]) for r in rows if r["name"] == "loss"]
    assert loss == [(s, 1.0 / (s + 1)) for s in range(250)]
    assert {(r["source"], r["name"], r["canonical"], r["member_rank"]) for r in rows} == {
        ("sdk", "loss", "loss", 2),
        ("sdk", "train/lr", "learning_rate", 2),
    }


def test_sdk_without_a_token_does_nothing() -> None:
    script = "from tuneplane import sdk\nsdk.log({'loss': 1.0}, step=1)\nprint(sdk.flush())\n"
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=REPO, env={"PATH": "/usr/bin"}, capture_output=True, timeout=60
    )
    assert done.returncode == 0 and done.stdout.decode().strip() == "True"
