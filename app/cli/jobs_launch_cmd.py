"""`tuneplane jobs cancel|preempt|logs` and the launch part of `tuneplane jobs show` (members, attempts,
why it waits), all over the HTTP API. The `jobs` group itself lives in app/cli/submit_cmd.py."""

from __future__ import annotations

from datetime import UTC, datetime

import click

from tuneplane.app import humanize
from tuneplane.app.cli.log_follow import print_logs
from tuneplane.app.cli.options import api_client, client_options, json_option, print_json, print_table
from tuneplane.app.cli.submit_cmd import jobs_group


def echo_waiting(job: dict) -> None:
    """The 'why it waits' line of a queued job (after the job's first line)."""
    waiting = job.get("waiting")
    if waiting:
        click.echo(f"  {'why it waits':<16} {waiting['text']}")


def echo_idle(job: dict) -> None:
    """The idle-GPU lines of `jobs show`: the warning and its deadline, an exemption, idle GPU-seconds."""
    idle = job.get("idle")
    if not idle:
        return
    if idle.get("warned_at") and job.get("state") not in ("succeeded", "failed", "cancelled"):
        click.echo(f"  {'idle warning':<16} {idle['warning']}")
        deadline = "none (the fleet's idle policy only warns)"
        if idle.get("deadline"):
            deadline = (
                f"{humanize.utc_minute(str(idle['deadline']))} (stopped then unless its GPUs become busy)"
            )
        click.echo(f"  {'idle deadline':<16} {deadline}")
    if idle.get("exempt_at"):
        click.echo(f"  {'idle exempt':<16} by {idle['exempt_by']}: {idle['exempt_reason']}")
    if idle.get("idle_gpu_seconds"):
        click.echo(f"  {'idle GPU-s':<16} {round(idle['idle_gpu_seconds']):,} GPU-seconds found idle")


def echo_launch(job: dict) -> None:
    """Attempts and members of `jobs show` (before the events)."""
    attempts = job.get("attempts") or []
    members = job.get("members") or []
    if not attempts:
        click.echo("attempts: none yet (a job gets an attempt when placement reserves its nodes)")
        return
    click.echo("attempts:")
    for a in attempts:
        decision = f"{a['decision']}: {a['decision_reason']}" if a.get("decision") else "no decision yet"
        click.echo(f"  #{a['number']:<3} {a['state']:<10} {a['reason']}  [{decision}]")
        p = a.get("preemption") or {}
        if p.get("resumed_from"):
            click.echo(f"       resumed from {p['resumed_from']}")
        if p.get("in_grace"):
            until = humanize.utc_minute(str(p["grace_deadline"]))
            click.echo(f"       in its grace until {until}: {p['stop_cause']}")
        if p.get("lost"):  # GPU-s and seconds, or seconds and CPU-s for a CPU-only job (lost_words)
            click.echo(f"       {p['lost']} since its last verified checkpoint")
    click.echo("members:")
    rows = [
        {
            **m,
            "gpus": ",".join(str(g) for g in m["gpu_indices"]) or "-",
            "memory": humanize.size(m["memory_bytes"]),
            "ran": _ran(m),
            "exit": "-" if m["exit_code"] is None else m["exit_code"],
            "resources": "held" if m["resources_held"] else "released",
        }
        for m in members
    ]
    print_table(
        rows, ["attempt", "rank", "node", "gpus", "memory", "state", "ran", "exit", "resources", "reason"]
    )


def _ran(member: dict) -> str:
    """How long the member ran (so far, while it runs)."""
    if not member.get("started_at"):
        return "-"
    started = datetime.fromisoformat(str(member["started_at"]))
    ended = datetime.fromisoformat(str(member["ended_at"])) if member.get("ended_at") else datetime.now(UTC)
    return humanize.duration((ended - started).total_seconds())


@jobs_group.command("cancel")
@click.argument("job_id")
@click.option("--reason", default=None, help="Why (recorded in the job's events).")
@json_option
@client_options
def jobs_cancel(job_id: str, reason: str | None, as_json: bool, server, token, ca_bundle) -> None:
    """Cancel a job: stops every member (SIGTERM, grace period, SIGKILL); resources are released when the
    nodes confirm."""
    with api_client(server, token, ca_bundle) as client:
        job = client.post(f"/jobs/{job_id}/cancel", json={"reason": reason} if reason else {})["job"]
    if as_json:
        print_json(job)
        return
    click.echo(f"job {job['id']} {job['state']}: {job['state_reason']}")


@jobs_group.command("preempt")
@click.argument("job_id")
@click.option(
    "--grace", type=click.IntRange(0, 86400), default=None, help="Seconds to checkpoint (default: the job's)."
)
@json_option
@client_options
def jobs_preempt(job_id: str, grace: int | None, as_json: bool, server, token, ca_bundle) -> None:
    """Ask a running job to checkpoint and stop (installation admins): it is queued again and resumes from
    its newest verified checkpoint; a preemption does not spend one of its max_attempts."""
    with api_client(server, token, ca_bundle) as client:
        attempt = client.post(f"/jobs/{job_id}/preempt", json={} if grace is None else {"grace": grace})[
            "attempt"
        ]
    if as_json:
        print_json(attempt)
        return
    click.echo(
        f"job {job_id} attempt {attempt['number']}: asked to checkpoint and stop "
        f"({attempt['stop_cause']}); grace until {humanize.utc_minute(str(attempt['grace_deadline']))}"
    )


@jobs_group.command("exempt-idle")
@click.argument("job_id")
@click.option("--reason", required=True, help="Why the job may keep idle GPUs (recorded on its timeline).")
@json_option
@client_options
def jobs_exempt_idle(job_id: str, reason: str, as_json: bool, server, token, ca_bundle) -> None:
    """Exempt a job from the idle-GPU policy (installation admins): it is never warned or reclaimed again."""
    with api_client(server, token, ca_bundle) as client:
        row = client.post(f"/jobs/{job_id}/exempt-idle", json={"reason": reason})["idle"]
    if as_json:
        print_json(row)
        return
    click.echo(f"job {job_id} is exempt from the idle policy ({row['exempt_reason']})")


@jobs_group.command("logs")
@click.argument("job_id")
@click.option(
    "--member", "rank", default=None, type=int, help="One member's rank.  [default: every member, prefixed]"
)
@click.option("--stream", type=click.Choice(["stdout", "stderr"]), default="stdout", show_default=True)
@click.option("--attempt", type=int, default=None, help="Default: the latest attempt.")
@click.option("--tail", type=int, default=None, help="Start at most this many bytes before the end.")
@click.option("--follow", "-f", is_flag=True, help="Keep printing new output until the job has finished.")
@click.option(
    "--poll", default=1.0, show_default=True, type=float, help="Seconds between polls with --follow."
)
@client_options
def jobs_logs(
    job_id: str,
    rank: int | None,
    stream: str,
    attempt: int | None,
    tail: int | None,
    follow: bool,
    poll: float,
    server,
    token,
    ca_bundle,
) -> None:
    """Print the members' stdout (or stderr): every member's lines prefixed with its rank (`[rank 1] …`),
    or one member's with --member. With --follow, poll (bounded reads) until the job is finished; a
    retry's new attempt is followed too."""
    with api_client(server, token, ca_bundle) as client:
        print_logs(
            client, job_id, rank=rank, stream=stream, attempt=attempt, tail=tail, follow=follow, poll=poll
        )


COMMANDS: list = []  # the commands above join the `jobs` group of app.cli.submit_cmd
