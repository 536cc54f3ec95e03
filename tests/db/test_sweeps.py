"""The sweeps (workers/sweeps.py): one function each, one schedule, prune_node_commands included."""

from __future__ import annotations

import re
import threading
from pathlib import Path

import psycopg
import pytest

from tests.helpers import wait_for
from tests.node_helpers import enroll, make_fleet, make_token
from tuneplane.app.db import Database
from tuneplane.workers.sweeps import SCHEDULE, SLURM_SCHEDULE, Sweep, SweepContext, Sweeper

REPO = Path(__file__).resolve().parents[2]


def _old_and_new_acked_commands(db: Database) -> tuple[int, int]:
    make_fleet(db)
    node, _ = enroll(db, make_token(db), "n1")
    ids = []
    for age in ("8 days", "1 hour"):
        cmd = db.call("enqueue_node_command", node["node_id"], "ping", "{}", "test")[0]
        cmd_id = cmd["id"]
        # Set-up only: an acknowledgement that happened `age` ago.
        db.fetch_all(
            "UPDATE node_commands SET acked_at = now() - %s::interval WHERE id = %s RETURNING id",
            (age, cmd_id),
        )
        ids.append(cmd_id)
    return ids[0], ids[1]


def test_one_round_runs_every_sweep_and_prunes_old_node_commands(
    db_url: str, db: Database, tmp_path: Path
) -> None:
    old, new = _old_and_new_acked_commands(db)
    said: list[str] = []
    sweeper = Sweeper(db_url, tmp_path / "blobs", say=said.append)
    sweeper.run_due(SweepContext(db, tmp_path / "blobs"), {s.name: 0.0 for s in SCHEDULE})
    assert sweeper.runs == {s.name: 1 for s in SCHEDULE}
    left = {r["id"] for r in db.fetch_all("SELECT id FROM node_commands")}
    assert old not in left and new in left
    assert "sweep prune_node_commands: 1 acknowledged node command(s) older than 7 days deleted" in said


def test_the_schedule_holds_every_sweep_once_with_prune_node_commands() -> None:
    names = [s.name for s in SCHEDULE]
    assert len(names) == len(set(names))
    assert {"prune_node_commands", "telemetry_prune", "note_connectivity_changes", "blob_gc"} <= set(names)


def test_a_slurm_only_installation_runs_the_grace_ends_and_the_time_limits() -> None:
    """The Slurm worker may run without a node worker: the sweeps whose requests it delivers run in it."""
    assert {s.name for s in SLURM_SCHEDULE} == {"expire_grace_deadlines", "expire_time_limits"}


def test_no_other_module_runs_a_sweep() -> None:
    """Scheduled from one place: no module but workers/sweeps.py names a sweep's stored function."""
    functions = [s.name for s in SCHEDULE if s.name != "blob_gc"]
    pattern = re.compile("|".join(rf"[\"'.]{name}\b" for name in functions))
    found = []
    for folder in ("app", "workers"):
        for path in sorted((REPO / folder).rglob("*.py")):
            # sweeps.py runs them; app/db_functions.py only declares every stored function Python calls.
            if path in (REPO / "workers" / "sweeps.py", REPO / "app" / "db_functions.py"):
                continue
            for number, line in enumerate(path.read_text().splitlines(), 1):
                if pattern.search(line) and not line.lstrip().startswith("#"):
                    found.append(f"{path.relative_to(REPO)}:{number}: {line.strip()}")
    assert found == []


def test_a_failing_sweep_is_logged_and_the_others_still_run(
    db_url: str, db: Database, tmp_path: Path
) -> None:
    def broken(_ctx: SweepContext) -> str | None:
        raise psycopg.errors.UndefinedFunction("function tuneplane.gone() does not exist")

    ran = threading.Event()

    def fine(_ctx: SweepContext) -> str | None:
        ran.set()
        return None

    schedule = (Sweep("broken", broken), Sweep("fine", fine))
    sweeper = Sweeper(db_url, tmp_path, poll_interval=0.05, schedule=schedule, say=lambda _l: None)
    sweeper.start()
    try:
        wait_for(lambda: sweeper.runs["fine"] >= 3, timeout=10, what="the healthy sweep runs on")
    finally:
        sweeper.close()
    assert ran.is_set() and sweeper.runs["broken"] == 0


def test_an_unknown_interval_override_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="no sweep named prune_everything"):
        Sweeper("postgresql://unused", tmp_path, every={"prune_everything": 1.0})
