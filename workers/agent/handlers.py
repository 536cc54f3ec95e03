"""The command registry: one async function per command kind the gateway may deliver.

A handler gets the agent context and the command's payload and returns a JSON-able dict (the result
stored with the acknowledgement) or raises CommandFailed (stored as the error). Delivery is at least once
and in order per node: a handler must be idempotent per command id. The kinds: `ping` (here),
`prepare`, `start`, `stop`, `abort` and `kill` (workers.agent.launch, keyed on member and epoch),
`checkpoint` (workers.agent.checkpoints) and `preempt` (workers.agent.preemption); each module adds its
kinds with `@command("kind")` and is imported by workers.agent.main. SESSION_HOOKS run whenever a
control session opens: the reconcile report (launch), the workload directory check (workload_dir_check)
and the cache sizes (disk_cleanup).
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from tuneplane.workers.agent.directories import AgentPaths


class CommandFailed(Exception):
    """The command was understood and could not be carried out; the message is stored with the ack."""


@dataclass
class AgentContext:
    node_id: int | None = None
    node: str | None = None
    fleet: str | None = None
    paths: AgentPaths | None = None
    # What this agent runs now; every heartbeat carries it (the launch issue fills it).
    running: list[dict[str, Any]] = field(default_factory=list)
    # Sends a report (kind, payload) over the current control session and returns its result.
    report: Callable[[str, dict], Awaitable[Any]] | None = None
    # Free for handlers to keep per-agent state in (e.g. the launch issue's member table).
    extra: dict[str, Any] = field(default_factory=dict)


CommandHandler = Callable[[AgentContext, dict], Awaitable[dict | None]]

COMMAND_HANDLERS: dict[str, CommandHandler] = {}

# Run (each as its own task) whenever a control session opens, after the hello: the launch code's
# reconcile report goes here.
SESSION_HOOKS: list[Callable[[AgentContext], Awaitable[None]]] = []


def command(kind: str) -> Callable[[CommandHandler], CommandHandler]:
    def register(handler: CommandHandler) -> CommandHandler:
        COMMAND_HANDLERS[kind] = handler
        return handler

    return register


@command("ping")
async def ping(ctx: AgentContext, payload: dict) -> dict:
    """Round trip check (operators, tests and the benchmark): echoes the payload with the receive time."""
    return {"pong": True, "node": ctx.node, "received_at": time.time(), "echo": payload}
