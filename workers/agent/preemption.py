"""PREEMPT: a running member is asked to checkpoint and stop within its grace (docs/preemption.md).

The control plane (request_preemption, sql/functions/preemption.sql) decides; the agent only tells the
workload, three ways at once so any code hears it:

- the file `.tuneplane/preempt.json` under the member's output directory ({"kind", "reason", "deadline",
  "grace_seconds", "signal"}), which `tuneplane.sdk.preempting()` and its callback read, and which code
  without the SDK can watch;
- the signal the job chose (JobSpec preemption.signal, SIGTERM by default), sent to the workload's
  processes only: never to the runner or its keeper (a SIGUSR1 would end them), nor to the collector.

What happens next is the workload's: it saves and publishes a checkpoint (sdk.checkpoint, wait=True) and
exits. If it does not, the control plane stops it with STOP when the grace ends (expire_grace_deadlines).
A PREEMPT delivered twice writes the same file and signals again, which a workload must tolerate.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
from pathlib import Path

from tuneplane.workers.agent.checkpoints import control_dir
from tuneplane.workers.agent.handlers import AgentContext, CommandFailed, command
from tuneplane.workers.agent.member_records import member_dir
from tuneplane.workers.proctree import alive, signal_all
from tuneplane.workers.runner.process import read_runner_pids

PREEMPT_FILE = "preempt.json"
# The signals a job may choose (JobSpec preemption.signal); anything else is refused by the preview.
SIGNALS = ("SIGTERM", "SIGINT", "SIGHUP", "SIGUSR1", "SIGUSR2")


def write_request(directory: Path, payload: dict) -> None:
    """The request as a file under the member's output directory (atomic: the SDK never sees half of it)."""
    target = control_dir(directory)
    target.mkdir(parents=True, exist_ok=True)
    body = {key: payload.get(key) for key in ("kind", "reason", "deadline", "grace_seconds", "signal")}
    tmp = target / f".{PREEMPT_FILE}.tmp"
    tmp.write_text(json.dumps(body))
    os.replace(tmp, target / PREEMPT_FILE)


@command("preempt")
async def preempt(ctx: AgentContext, payload: dict) -> dict:
    from tuneplane.workers.agent.launch import _say, launch_agent

    member_id = int(payload["member_id"])
    assert ctx.paths is not None
    directory = member_dir(ctx.paths, member_id)
    if not (directory / "output").is_dir():
        raise CommandFailed(f"member {member_id} does not run on this node")
    name = str(payload.get("signal") or "SIGTERM")
    if name not in SIGNALS:
        raise CommandFailed(f"signal {name} is not one a job may choose ({', '.join(SIGNALS)})")
    await asyncio.to_thread(write_request, directory, payload)
    agent = launch_agent(ctx)
    record = agent.store.get(member_id)
    if record is None or record.state != "running":
        return {"member_id": member_id, "signalled": 0, "state": record.state if record else None}
    pids = await asyncio.to_thread(agent.processes_of, record)
    spared = {record.pid, record.collector_pid}
    keeper = read_runner_pids(directory)
    if keeper.get("keeper") and alive(keeper["keeper"], keeper.get("keeper_started")):
        spared.add(keeper["keeper"])
    workload = {pid for pid in pids if pid not in spared}
    signal_all(workload, getattr(signal, name))
    _say(
        ctx,
        f"member {member_id}: asked to checkpoint and stop ({payload.get('reason')}); {name} to "
        f"{len(workload)} process(es); grace {payload.get('grace_seconds')} s",
    )
    return {"member_id": member_id, "signalled": len(workload), "signal": name}
