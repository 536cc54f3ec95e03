"""`tuneplane worker --backend node|slurm` (capsules, prepare/commit, placement) and `tuneplane runner`."""

from __future__ import annotations

import socket

import click

from tuneplane.app.cli.options import server_side, settings_from


@click.command("worker")
@click.option(
    "--backend",
    type=click.Choice(["node", "slurm"]),
    required=True,
    help="Which backend this worker drives (node: TunePlane's own node agents; slurm: every Slurm fleet).",
)
@click.option("--name", default=None, help="This worker's name in leases and events (default: host:pid).")
@click.option(
    "--poll-interval",
    type=float,
    default=1.0,
    show_default=True,
    help="Seconds between placement passes and sweeps when no NOTIFY wakes the loop.",
)
@click.option(
    "--heartbeat-timeout",
    type=click.FloatRange(5, 3600),
    default=10.0,
    show_default=True,
    help="Seconds after which another worker takes over the launch of a worker that stopped beating "
    "(a killed worker's launch is taken over within this + max(poll interval, 0.5 s); docs/operations.md).",
)
@click.option("--hold-before-prepare", type=float, default=0.0, hidden=True)
@server_side
def worker_cmd(
    backend: str,
    name: str | None,
    poll_interval: float,
    heartbeat_timeout: float,
    hold_before_prepare: float,
    database_url: str | None,
    data_dir: str | None,
) -> None:
    """Run a backend worker: place queued jobs, build capsules and send PREPARE to the members' nodes
    (node), or submit, follow and cancel every Slurm fleet's jobs through Slurm's tools (slurm)."""
    import os

    from tuneplane.app.cli import ExpectedError
    from tuneplane.app.migrate import require_current
    from tuneplane.workers.backend.node_worker import WorkerOptions, main

    settings = settings_from(database_url, data_dir)
    if not settings.database_url:
        raise ExpectedError("tuneplane worker needs --database-url or TUNEPLANE_DATABASE_URL")
    require_current(settings.database_url)
    common = {
        "database_url": settings.database_url,
        "blob_dir": settings.blob_dir,
        "name": name or f"{socket.gethostname()}:{os.getpid()}",
        "poll_interval": poll_interval,
    }
    if backend == "slurm":
        from tuneplane.workers.slurm.worker import SlurmWorkerOptions
        from tuneplane.workers.slurm.worker import main as slurm_main

        slurm_main(SlurmWorkerOptions(**common))
        return
    main(WorkerOptions(**common, heartbeat_timeout=heartbeat_timeout,
                       hold_before_prepare=hold_before_prepare))  # fmt: skip


@click.command("runner")
@click.option(
    "--member-dir",
    required=True,
    type=click.Path(file_okay=False, exists=True),
    help="The member directory the agent prepared (member.json, capsule/, src/, logs/).",
)
def runner_cmd(member_dir: str) -> None:
    """Run one member (started by the node agent): check the pinned runtime, run the integration."""
    from tuneplane.workers.runner.process import main

    main(member_dir)


COMMANDS = [worker_cmd, runner_cmd]
