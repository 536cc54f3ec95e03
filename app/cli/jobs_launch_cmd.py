"""`tuneplane jobs cancel|logs` and the launch part of `tuneplane jobs show` (members, attempts, why it
waits), all over the HTTP API. The `jobs` group itself lives in app/cli/submit_cmd.py."""

from __future__ import annotations

import time
from typing import Any

import click

from app.cli.options import api_client, client_options, json_option, print_json, print_table
from app.cli.submit_cmd import jobs_group
from app.client.http import ApiClient

TERMINAL = ("succeeded", "failed", "cancelled")
READ_BYTES = 256 * 1024


def echo_waiting(job: dict) -> None:
    """The 'why it waits' line of a queued job (after the job's first line)."""
    waiting = job.get("waiting")
    if waiting:
        click.echo(f"  {'why it waits':<16} {waiting['text']}")


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
    click.echo("members:")
    rows = [
        {
            **m,
            "gpus": ",".join(str(g) for g in m["gpu_indices"]) or "-",
            "exit": "-" if m["exit_code"] is None else m["exit_code"],
            "resources": "held" if m["resources_held"] else "released",
        }
        for m in members
    ]
    print_table(rows, ["attempt", "rank", "node", "gpus", "state", "exit", "resources", "reason"])


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


def _read(client: ApiClient, job_id: str, params: dict[str, Any]) -> dict:
    return client.get(f"/jobs/{job_id}/logs", params={k: v for k, v in params.items() if v is not None})


@jobs_group.command("logs")
@click.argument("job_id")
@click.option("--member", "rank", default=0, show_default=True, type=int, help="The member's rank.")
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
    rank: int,
    stream: str,
    attempt: int | None,
    tail: int | None,
    follow: bool,
    poll: float,
    server,
    token,
    ca_bundle,
) -> None:
    """Print a member's stdout (or stderr). With --follow, poll (bounded reads) until the job is finished;
    a retry's new attempt is followed too."""
    pinned = attempt is not None
    after = 0
    with api_client(server, token, ca_bundle) as client:
        while True:
            data = _read(
                client,
                job_id,
                {
                    "member": rank,
                    "stream": stream,
                    "after": after,
                    "limit": READ_BYTES,
                    "attempt": attempt,
                    "tail": tail,
                },
            )
            tail = None
            if attempt is None and data["attempt"] is not None:
                attempt = data["attempt"]
            for chunk in data["chunks"]:
                click.echo(chunk["text"], nl=False)
            after = data["next"]
            if data["more"]:
                continue
            if not follow:
                break
            if data["job_state"] in TERMINAL:
                break
            if data["complete"] and not pinned:
                # This attempt's member has ended but the job has not: a retry may follow.
                latest = _read(client, job_id, {"member": rank, "stream": stream, "after": 0, "limit": 1})
                if latest["attempt"] is not None and latest["attempt"] != attempt:
                    click.echo(f"--- attempt {latest['attempt']} ---", err=True)
                    attempt, after = latest["attempt"], 0
                    continue
            time.sleep(max(poll, 0.1))


COMMANDS: list = []  # the commands above join the `jobs` group of app.cli.submit_cmd
