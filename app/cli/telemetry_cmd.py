"""`tuneplane telemetry-gateway`, `tuneplane collector` and `tuneplane metrics`."""

from __future__ import annotations

import logging
import os
import signal
from pathlib import Path

import click

from tuneplane.app import humanize
from tuneplane.app.cli import ExpectedError
from tuneplane.app.cli.options import json_option, print_json, print_table, server_side, settings_from


@click.command("telemetry-gateway")
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", default=8090, show_default=True, type=int)
@click.option("--pool-size", default=8, show_default=True, type=int, help="Database connections.")
@server_side
def telemetry_gateway_cmd(
    host: str, port: int, pool_size: int, database_url: str | None, data_dir: str | None
) -> None:
    """Serve the telemetry gateway that collectors and the SDK push metric batches to."""
    settings = settings_from(database_url, data_dir)
    if not settings.database_url:
        raise ExpectedError("tuneplane telemetry-gateway needs --database-url or TUNEPLANE_DATABASE_URL")
    from tuneplane.app.migrate import require_current
    from tuneplane.app.telemetry.gateway import serve

    require_current(settings.database_url)
    logging.getLogger("tuneplane.app.telemetry").setLevel(min(logging.INFO, logging.getLogger().level))
    click.echo(f"telemetry gateway listening on http://{host}:{port}", err=True)
    serve(settings.database_url, host, port, pool_max=pool_size)


@click.command("collector")
@click.option(
    "--output-dir",
    required=True,
    type=click.Path(file_okay=False, path_type=Path),
    help="The member's output directory (TensorBoard event files, *.jsonl).",
)
@click.option(
    "--spool-dir",
    required=True,
    type=click.Path(file_okay=False, path_type=Path),
    help="Private host-local directory for the durable spool (network filesystems are refused).",
)
@click.option("--gateway", envvar="TUNEPLANE_TELEMETRY_URL", required=True, help="Telemetry gateway URL.")
@click.option(
    "--token",
    envvar="TUNEPLANE_TELEMETRY_TOKEN",
    required=True,
    help="The member's telemetry token (env TUNEPLANE_TELEMETRY_TOKEN).",
)
@click.option("--collector-id", default=None, help="Name for this collector (default: host name).")
@click.option("--job-id", type=int, default=None, envvar="TUNEPLANE_JOB_ID")
@click.option("--attempt", type=int, default=None, envvar="TUNEPLANE_ATTEMPT")
@click.option("--member", type=int, default=None, envvar="TUNEPLANE_MEMBER_RANK")
@click.option("--poll-interval", type=float, default=0.5, show_default=True)
@click.option(
    "--fsync-interval",
    type=float,
    default=1.0,
    show_default=True,
    help="Seconds between spool fsyncs (0: after every batch).",
)
@click.option(
    "--drain-timeout",
    type=float,
    default=30.0,
    show_default=True,
    help="On SIGTERM, keep shipping this long before exiting.",
)
@click.option(
    "--batch-points",
    type=click.IntRange(1, 100_000),
    default=65536,
    show_default=True,
    help="Most points in one batch.",
)
@click.option(
    "--sample-interval",
    type=float,
    default=10.0,
    show_default=True,
    help="Seconds between host/GPU samples of the member (0: none).",
)
@click.option("--member-tag", default=None, help="The member's process tag (its CPU and RSS are sampled).")
@click.option("--gpus", default="", help="The member's GPU indices, comma separated (sampled through NVML).")
@click.option(
    "--orphan-grace",
    type=click.FloatRange(0.1),
    default=30.0,
    show_default=True,
    help="With --member-tag: once the collector's parent (the agent) is gone and no process of the member "
    "has run for this many seconds, drain and stop as if the member exited.",
)
@click.option(
    "--drain-signal",
    type=click.Choice(["SIGTERM", "SIGRTMIN"]),
    default="SIGTERM",
    show_default=True,
    help="The signal that asks for the drain. SIGRTMIN (a Slurm step's collector): every signal a job's "
    "cancel or preemption may send — SIGTERM, SIGINT, SIGHUP, SIGUSR1, SIGUSR2, which `scancel` delivers "
    "to every process of the step — is then ignored, and the collector goes on collecting what the "
    "workload writes during its grace.",
)
@click.option("--ca-bundle", envvar="TUNEPLANE_CA_BUNDLE", default=None)
def collector_cmd(
    output_dir: Path,
    spool_dir: Path,
    gateway: str,
    token: str,
    collector_id: str | None,
    job_id: int | None,
    attempt: int | None,
    member: int | None,
    poll_interval: float,
    fsync_interval: float,
    drain_timeout: float,
    batch_points: int,
    sample_interval: float,
    member_tag: str | None,
    gpus: str,
    orphan_grace: float,
    drain_signal: str,
    ca_bundle: str | None,
) -> None:
    """Tail a member's metric files and ship them to the telemetry gateway through a durable spool."""
    from tuneplane.workers.proctree import STOP_SIGNALS

    # First: the drain signal from here on only asks for a drain. The agent and the Slurm step start the
    # collector with STOP_SIGNALS blocked, so a signal sent before this point stays pending instead of
    # killing the process.
    stop_requested: list[bool] = []
    collector = None

    def _stop(_signum: int, _frame: object) -> None:
        stop_requested.append(True)
        if collector is not None:
            collector.stop()

    def _not_ours(_signum: int, _frame: object) -> None:
        """A job's cancel or preemption signal: the workload's, not a request to drain."""

    drain = getattr(signal, drain_signal)
    # A job's preemption signal (SIGUSR1/SIGUSR2/SIGHUP, or SIGTERM/SIGINT) is the workload's; on a Slurm
    # fleet `scancel --signal` reaches every process of the step, this one too, and their default action
    # would end it. A handler, not SIG_IGN, so nothing this process starts inherits an ignored signal.
    for sig in (signal.SIGUSR1, signal.SIGUSR2, signal.SIGHUP, signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, _not_ours)
    signal.signal(drain, _stop)
    if drain == signal.SIGTERM:
        signal.signal(signal.SIGINT, _stop)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)

    from tuneplane.app.client.transport import ClientError
    from tuneplane.workers.collector.collector import Collector, CollectorConfig, CollectorError
    from tuneplane.workers.collector.fs_check import NetworkFilesystemError
    from tuneplane.workers.collector.spool import SpoolInUse

    logging.getLogger("tuneplane.workers.collector").setLevel(logging.INFO)
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per batch is noise
    scope = None
    if job_id is not None or attempt is not None or member is not None:
        scope = {
            k: v for k, v in (("job_id", job_id), ("attempt", attempt), ("member", member)) if v is not None
        }
    output_dir.mkdir(parents=True, exist_ok=True)
    config = CollectorConfig(
        output_dir=output_dir,
        spool_dir=spool_dir,
        gateway_url=gateway,
        token=token,
        collector_id=collector_id,
        scope=scope,
        poll_interval=poll_interval,
        fsync_interval=fsync_interval,
        drain_timeout=drain_timeout,
        ca_bundle=ca_bundle,
        batch_points=batch_points,
        sample_interval=sample_interval,
        member_tag=member_tag,
        gpu_indices=tuple(int(g) for g in gpus.split(",") if g.strip().isdigit()),
        orphan_grace=orphan_grace,
    )
    try:
        collector = Collector(config)
    except (NetworkFilesystemError, CollectorError, ClientError, SpoolInUse) as exc:
        raise ExpectedError(str(exc)) from exc
    if stop_requested:
        collector.stop()
    click.echo(
        f"collector {collector.collector_id} reading {output_dir}, spool {spool_dir}, "
        f"{collector.spool.pending_count()} batches pending, shipping to {gateway}",
        err=True,
    )
    status = collector.run()
    click.echo(f"collector stopped; {collector.spool.pending_count()} batches left in the spool", err=True)
    from tuneplane.workers.collector.markers import HOLD_EXIT_ENV

    if os.environ.get(HOLD_EXIT_ENV):  # tests only: a collector that lingers after its drain
        import time

        time.sleep(float(os.environ[HOLD_EXIT_ENV]))
    if status:
        raise SystemExit(status)


@click.command("metrics")
@click.argument("job_id", type=int)
@click.option("--name", default=None, help="Raw or canonical metric name (default: all canonical metrics).")
@click.option("--attempt", type=int, default=None)
@click.option("--member", type=int, default=None)
@click.option("--source", default=None)
@click.option("--max-points", type=click.IntRange(1, 1000), default=500, show_default=True)
@click.option("--server", default=None, help="Server URL (env TUNEPLANE_SERVER).")
@click.option("--token", default=None, help="API token (env TUNEPLANE_TOKEN).")
@json_option
def metrics_cmd(
    job_id: int,
    name: str | None,
    attempt: int | None,
    member: int | None,
    source: str | None,
    max_points: int,
    server: str | None,
    token: str | None,
    as_json: bool,
) -> None:
    """A job's metrics, downsampled to at most --max-points buckets per series."""
    from tuneplane.app.client.config import resolve
    from tuneplane.app.client.http import ApiClient

    params = {"max_points": max_points}
    for key, value in (("name", name), ("attempt", attempt), ("member", member), ("source", source)):
        if value is not None:
            params[key] = value
    with ApiClient(resolve(server, token)) as client:
        data = client.get(f"/jobs/{job_id}/metrics", params=params)
        health = client.get(f"/jobs/{job_id}/metrics/health")
    if as_json:
        print_json({**data, "health": health})
        return
    from tuneplane.app.telemetry.queries import CANONICAL_UNITS

    rows = []
    # A metric written twice by one member (JSONL and TensorBoard) is one row, the copy the server kept
    # (queries.mark_copies, as the charts); --json keeps both.
    for series in (s for s in data["series"] if not s.get("copy_of")):
        # Bytes (resident memory, GPU memory) in binary units, as the charts; --json keeps exact values.
        in_bytes = CANONICAL_UNITS.get(series.get("canonical") or "") == "bytes"
        shown = humanize.size if in_bytes else humanize.number
        buckets = series["buckets"]
        last = buckets[-1] if buckets else {}
        lows = [b["min"] for b in buckets if b["min"] is not None]
        highs = [b["max"] for b in buckets if b["max"] is not None]
        rows.append(
            {
                "name": series["name"],
                "canonical": series.get("canonical") or "",
                "source": series["source"]
                + (f" (also {', '.join(series['copies'])})" if series.get("copies") else ""),
                "attempt": series["attempt"],
                "member": series["member"],
                "points": series["point_count"],
                "steps": _steps(series) if buckets else "",
                "last": (
                    shown(last.get("last_value")) if last.get("non_finite") is None else last["non_finite"]
                ),
                "min": shown(min(lows, default=None)),
                "max": shown(max(highs, default=None)),
            }
        )
    print_table(
        rows,
        ["name", "canonical", "source", "attempt", "member", "points", "steps", "last", "min", "max"],
        empty="(no metrics yet)",
    )
    echo_health(health)


def _steps(series: dict) -> str:
    """A training series' step range; a system series' steps are epoch milliseconds: its time range."""
    from tuneplane.workers.collector.system import SOURCE as SYSTEM_SOURCE

    if series["source"] == SYSTEM_SOURCE:
        return humanize.epoch_ms_range(series["min_step"], series["max_step"])
    return f"{series['min_step']}..{series['max_step']}"


def echo_health(health: dict) -> None:
    """'metrics complete' or what is missing, then each damaged region and refused-point count."""
    members = ", ".join(
        f"a{m['attempt']} m{m['member_rank']} {m['state']}" + (f" ({m['reason']})" if m["reason"] else "")
        for m in health["members"]
    )
    click.echo(f"{health['summary']}" + (f": {members}" if members else ""))
    for d in health["damaged"]:
        click.echo(
            f"warning: damaged region skipped: a{d['attempt']} m{d['member_rank']} {d['what']} "
            f"at byte {d['file_offset']}, {d['bytes']} bytes: {d['reason']}"
        )
    for r in health["refused"]:
        what = f" {r['what'][:80]}" if r["what"] else ""
        where = f"a{r['attempt']} m{r['member_rank']} {r['source']}{what}"
        click.echo(f"warning: {r['count']} point(s) refused: {where}: {r['reason']}")


COMMANDS = [telemetry_gateway_cmd, collector_cmd, metrics_cmd]
