"""Every background sweep of TunePlane, one function each, and the one schedule that runs them.

A sweep is housekeeping nobody asks for: deadlines that passed, nodes that went silent, rows and blobs
nobody needs any more. Each is one stored function (the rule lives in SQL) or, for blobs, one collection
(app/artifacts/gc.py); each function below calls it once and says in a line what it changed (None when
nothing). SCHEDULE says how often each runs. Like River's internal/maintenance/, they are all here and
started from one place: `Sweeper`, run by every `tuneplane worker --backend node` (`tuneplane up` starts
one) on its own thread and connection, so a slow sweep never holds a placement pass or a launch.

Several workers may run: every sweep is safe to run from two at once (row locks with SKIP LOCKED, or an
idempotent DELETE/UPDATE; blob GC holds the store's exclusive gc lock). A sweep that fails is logged and
runs again at its next turn; it never ends the worker. docs/architecture.md lists them.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import psycopg

from tuneplane.app import db_functions as fn
from tuneplane.app.db import Database
from tuneplane.app.errors import Refusal

log = logging.getLogger("tuneplane.sweeps")


@dataclass(frozen=True)
class SweepContext:
    db: Database
    blob_dir: Path
    # Blob GC keeps an unreferenced blob younger than this (a writer may be about to record it).
    blob_gc_min_age: float = 3600.0


def _counted(ctx: SweepContext, function: str, what: str) -> str | None:
    """Call a sweep's stored function (it returns how many rows it changed); the line to log, if any."""
    n = int(ctx.db.call(function)[0][function] or 0)
    return f"{n} {what}" if n else None


# ---- launch deadlines and lost contact (sql/functions/launch.sql) ----------------------------------------


def expire_prepare_deadlines(ctx: SweepContext) -> str | None:
    return _counted(ctx, fn.expire_prepare_deadlines, "launch(es) past their prepare deadline aborted")


def sweep_lost_nodes(ctx: SweepContext) -> str | None:
    return _counted(ctx, fn.sweep_lost_nodes, "member(s) lost contact")


def expire_member_deadlines(ctx: SweepContext) -> str | None:
    return _counted(ctx, fn.expire_member_deadlines, "member(s) past their start/stop deadline sent KILL")


def requeue_stalled_launches(ctx: SweepContext) -> str | None:
    return _counted(ctx, fn.requeue_stalled_launches, "stalled launch(es) re-enqueued")


# ---- the checkpoint grace protocol (sql/functions/preemption.sql) -----------------------------------------


def expire_grace_deadlines(ctx: SweepContext) -> str | None:
    return _counted(ctx, fn.expire_grace_deadlines, "attempt(s) whose grace to checkpoint ended sent STOP")


def expire_time_limits(ctx: SweepContext) -> str | None:
    return _counted(ctx, fn.expire_time_limits, "attempt(s) past their time limit asked to stop")


# ---- nodes (sql/functions/nodes.sql) ----------------------------------------------------------------------


def note_connectivity_changes(ctx: SweepContext) -> str | None:
    return _counted(ctx, fn.note_connectivity_changes, "node(s) changed connectivity")


def prune_node_commands(ctx: SweepContext) -> str | None:
    """Acknowledged node commands older than a week (the default of the function)."""
    return _counted(ctx, fn.prune_node_commands, "acknowledged node command(s) older than 7 days deleted")


# ---- idle GPUs (sql/functions/idle.sql, docs/idle.md) ----------------------------------------------------


def sweep_idle_jobs(ctx: SweepContext) -> str | None:
    """Running jobs judged from their stored GPU samples: warned, reclaimed at their deadline, or busy again.
    Each job is evaluated at most once per idle_settings.check_every; one call evaluates at most 200."""
    row = ctx.db.call(fn.sweep_idle_jobs)[0]
    if not (row["warned"] or row["reclaimed"] or row["busy_again"]):
        return None
    return (
        f"idle GPUs: {row['warned']} job(s) warned, {row['reclaimed']} reclaimed, "
        f"{row['busy_again']} busy again"
    )


# ---- retention of telemetry and blobs ---------------------------------------------------------------------


def telemetry_prune(ctx: SweepContext) -> str | None:
    row = ctx.db.call(fn.telemetry_prune)[0]
    if not row["series"]:
        return None
    return f"telemetry retention removed {row['series']} series ({row['points']} points)"


def prune_team_event_deliveries(ctx: SweepContext) -> str | None:
    """Team webhook deliveries delivered or given up longer ago than webhook_settings.keep_for."""
    return _counted(
        ctx, fn.prune_team_event_deliveries, "team webhook deliveries past their keep_for deleted"
    )


def blob_gc(ctx: SweepContext) -> str | None:
    from tuneplane.app.artifacts.gc import collect
    from tuneplane.app.artifacts.s3_gc import collect_fleet_stores

    report = collect(ctx.db, ctx.blob_dir, min_age=ctx.blob_gc_min_age)
    said = []
    if report.removed:
        said.append(f"blob gc: removed {len(report.removed)} blob(s), {report.removed_bytes} bytes")
    for s3 in collect_fleet_stores(ctx.db, min_age=ctx.blob_gc_min_age):
        if s3.error:
            said.append(f"blob gc {s3.store}: not collected: {s3.error}")
        elif s3.removed or s3.aborted_uploads or s3.removed_objects:
            said.append(
                f"blob gc {s3.store}: removed {len(s3.removed) + s3.removed_objects} object(s), "
                f"{s3.removed_bytes} bytes; "
                f"aborted {s3.aborted_uploads} multipart upload(s) of ended artifacts"
            )
    return "; ".join(said) or None


@dataclass(frozen=True)
class Sweep:
    name: str
    run: Callable[[SweepContext], str | None]
    # Seconds between two runs; None: the worker's poll interval (--poll-interval, 1 s by default).
    every: float | None = None
    # Whether the first run waits one interval (the long, costly sweeps: not at every worker start).
    first_after_interval: bool = False


# The one schedule.
SCHEDULE: tuple[Sweep, ...] = (
    # Launch deadlines and contact: their effects (a KILL, a retry, freed capacity) are due within seconds.
    Sweep("expire_prepare_deadlines", expire_prepare_deadlines),
    Sweep("sweep_lost_nodes", sweep_lost_nodes),
    Sweep("expire_member_deadlines", expire_member_deadlines),
    Sweep("requeue_stalled_launches", requeue_stalled_launches),
    # A grace that ended and a time limit reached are due within seconds too (docs/preemption.md).
    Sweep("expire_grace_deadlines", expire_grace_deadlines),
    Sweep("expire_time_limits", expire_time_limits),
    # The Fleet page's connected -> stale -> lost events (the state itself is computed from heartbeat age).
    Sweep("note_connectivity_changes", note_connectivity_changes),
    # Idle GPUs: the function itself evaluates each job at most once per check_every (1 min).
    Sweep("sweep_idle_jobs", sweep_idle_jobs, every=5.0),
    Sweep("prune_node_commands", prune_node_commands, every=3600.0),
    Sweep("telemetry_prune", telemetry_prune, every=3600.0),
    Sweep("prune_team_event_deliveries", prune_team_event_deliveries, every=3600.0),
    Sweep("blob_gc", blob_gc, every=6 * 3600.0, first_after_interval=True),
)

# What `tuneplane worker --backend slurm` runs itself, since it may run without a node worker: the end of a
# grace to checkpoint, after which it cancels the Slurm job (slurm_scancel_due, docs/preemption.md), and
# the time limits, whose request it delivers (slurm_preemptions_due).
SLURM_SCHEDULE: tuple[Sweep, ...] = tuple(
    s for s in SCHEDULE if s.name in ("expire_grace_deadlines", "expire_time_limits")
)


class Sweeper:
    """Runs SCHEDULE: each sweep when its interval has passed, one at a time, on one connection."""

    def __init__(
        self,
        database_url: str,
        blob_dir: Path,
        *,
        poll_interval: float = 1.0,
        every: dict[str, float] | None = None,
        blob_gc_min_age: float = 3600.0,
        say: Callable[[str], None] = print,
        schedule: tuple[Sweep, ...] = SCHEDULE,
    ) -> None:
        self.database_url = database_url
        self.blob_dir = Path(blob_dir)
        self.blob_gc_min_age = blob_gc_min_age
        self.say = say
        overrides = every or {}
        unknown = set(overrides) - {s.name for s in schedule}
        if unknown:
            raise ValueError(f"no sweep named {', '.join(sorted(unknown))}")
        # Each sweep with its interval in seconds: an override, else its own, else the poll interval.
        self.every = {s.name: float(overrides.get(s.name) or s.every or poll_interval) for s in schedule}
        self.schedule = schedule
        self.stop = threading.Event()
        self.runs: dict[str, int] = {s.name: 0 for s in self.schedule}
        self._thread: threading.Thread | None = None

    def run_due(self, ctx: SweepContext, next_at: dict[str, float]) -> None:
        for sweep in self.schedule:
            if self.stop.is_set():
                return
            now = time.monotonic()
            if now < next_at[sweep.name]:
                continue
            next_at[sweep.name] = now + self.every[sweep.name]
            try:
                said = sweep.run(ctx)
            except (psycopg.Error, OSError, Refusal) as exc:
                log.warning(
                    "sweep %s failed (it runs again in %.1f s): %s", sweep.name, self.every[sweep.name], exc
                )
                continue
            self.runs[sweep.name] += 1
            if said:
                self.say(f"sweep {sweep.name}: {said}")

    def run(self) -> None:
        """The loop (on the calling thread) until stop is set."""
        db = Database(self.database_url, min_size=1, max_size=1, name="tuneplane-sweeps")
        try:
            ctx = SweepContext(db, self.blob_dir, self.blob_gc_min_age)
            start = time.monotonic()
            next_at = {
                s.name: start + (self.every[s.name] if s.first_after_interval else 0.0) for s in self.schedule
            }
            while not self.stop.is_set():
                self.run_due(ctx, next_at)
                self.stop.wait(max(0.05, min(next_at.values()) - time.monotonic()))
        finally:
            db.close()

    def start(self) -> threading.Thread:
        self._thread = threading.Thread(target=self._run_logged, name="sweeps", daemon=True)
        self._thread.start()
        return self._thread

    def _run_logged(self) -> None:
        while not self.stop.is_set():
            try:
                self.run()
            except Exception as exc:  # the pool could not open (database down): start again shortly
                log.warning("sweeps stopped (%s); starting again in 1 s", exc)
                self.stop.wait(1.0)

    def close(self, timeout: float = 10.0) -> None:
        self.stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
