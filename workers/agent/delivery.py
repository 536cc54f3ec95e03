"""Output delivery after a member ended: a durable, retried task of the agent, one per member.

The member's record (workers.agent.member_records) holds what is left to deliver (`deliveries`: per output its
state, tries, last error and artifact id) and the deadline (`deliver_by`), so delivery goes on across
reconnects and agent restarts: an agent that starts again resumes every member with outputs pending.

Each pass tries every pending output once (registration and upload; an upload resumes from the chunks the
server already holds). A retryable failure (5xx, connection refused or lost, an upload cut short) waits
with exponential backoff (1 s doubling, capped at 60 s) and tries again; a refusal that will not change
(a 4xx, a missing output directory) ends that output as `failed`. Past the deadline every output still
pending is given up: a registered artifact is marked `failed` on the server with the reason, one never
registered is recorded failed in the member's record (the agent log says why). The member's exit status
never depends on any of this: the artifact carries its own state.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from pathlib import Path

from tuneplane.workers.agent.member_records import MemberRecord, MemberStore, pending
from tuneplane.workers.agent.outputs import (
    Outcome,
    deliver_output,
    fail_artifact,
    planned_outputs,
    refuse_output,
)
from tuneplane.workers.agent.prepare import NodeAccess
from tuneplane.workers.artifacts.member_logs import logs_output

log = logging.getLogger("tuneplane.agent.delivery")

DEFAULT_DEADLINE = 6 * 3600.0
BACKOFF_BASE, BACKOFF_CAP = 1.0, 60.0


def plan_deliveries(record: MemberRecord, directory: Path, deadline: float, *, outputs: bool = True) -> None:
    """Fill the record's deliveries for a member that ended (saved by the caller with its end): the spec's
    outputs when it exited 0 (`outputs`), and its logs whatever its exit status."""
    outputs = [*(planned_outputs(directory) if outputs else []), logs_output()]
    record.deliveries = {
        o["name"]: {"output": o, "state": "pending", "tries": 0, "error": "", "artifact_id": None}
        for o in outputs
    }
    record.deliver_by = time.time() + deadline if outputs else None


def backoff(tries: int) -> float:
    return min(BACKOFF_CAP, BACKOFF_BASE * 2 ** min(max(tries - 1, 0), 16))


class Delivery:
    """The delivery task of one member; `first_pass` is set once every output was tried once."""

    def __init__(
        self,
        store: MemberStore,
        member_id: int,
        directory: Path,
        access: Callable[[], NodeAccess],
        say: Callable[[str], None],
    ) -> None:
        self.store = store
        self.member_id = member_id
        self.directory = directory
        self.access = access
        self.say = say
        self.first_pass = asyncio.Event()
        self.wake = asyncio.Event()
        self.task = asyncio.get_running_loop().create_task(self.run(), name=f"deliver-{member_id}")

    def done(self) -> bool:
        return self.task.done()

    async def run(self) -> None:
        try:
            while True:
                record = self.store.get(self.member_id)
                if record is None or not pending(record):
                    return
                await self.one_pass(record)
                self.first_pass.set()
                left = pending(record)
                if not left:
                    return
                tries = min(record.deliveries[name]["tries"] for name in left)
                delay = backoff(tries)
                if record.deliver_by is not None and time.time() < record.deliver_by:
                    delay = min(delay, record.deliver_by - time.time())  # wake for the deadline
                self.wake.clear()
                try:
                    await asyncio.wait_for(self.wake.wait(), timeout=max(delay, 0.05))
                except TimeoutError:
                    pass
        finally:
            self.first_pass.set()

    async def one_pass(self, record: MemberRecord) -> None:
        """Every pending output tried once, side by side: a member's outputs are independent artifacts, and
        the member's end waits for this pass (a gang's members all end at once, issue 23)."""
        expired = record.deliver_by is not None and time.time() >= record.deliver_by
        names = pending(record)
        tries = (self._try(name, record.deliveries[name], expired) for name in names)
        outcomes = await asyncio.gather(*tries)
        for name, outcome in zip(names, outcomes, strict=True):
            self._record(record, name, outcome)
        error = self.store.keep(record)  # a full disk never stops the delivery (it goes on from memory)
        if error is not None:
            self.say(f"member {self.member_id}: its delivery state could not be written ({error})")

    async def _try(self, name: str, item: dict, expired: bool) -> Outcome:
        if expired:
            return await self._give_up(name, item)
        try:
            return await asyncio.to_thread(deliver_output, self.access(), self.directory, item["output"])
        except Exception as exc:
            # Whatever one output raises must not stop the others nor the task: it is retried like a server
            # failure until the deadline fails it with this reason.
            log.exception("member %s: delivering output %s", self.member_id, name)
            return Outcome("retry", f"unexpected {type(exc).__name__}: {exc}")

    def _record(self, record: MemberRecord, name: str, outcome: Outcome) -> None:
        item = record.deliveries[name]
        item["tries"] += 1
        item["artifact_id"] = outcome.artifact_id or item["artifact_id"]
        if outcome.state == "complete":
            item["state"], item["error"] = "complete", ""
            self.say(f"member {self.member_id}: output {name} delivered (artifact {item['artifact_id']})")
        elif outcome.state == "failed":
            item["state"], item["error"] = "failed", outcome.reason
            self.say(f"member {self.member_id}: output {name} failed: {outcome.reason}")
        else:
            item["error"] = outcome.reason
            self.say(
                f"member {self.member_id}: output {name} not delivered yet (try {item['tries']}): "
                f"{outcome.reason}; retrying in {backoff(item['tries']):.0f}s"
            )

    async def _give_up(self, name: str, item: dict) -> Outcome:
        reason = f"delivery gave up at its deadline; last error: {item['error'] or 'none recorded'}"
        item["state"] = "failing"
        if item["artifact_id"] is None:
            # Never registered: recorded on the server as a failed artifact, so its user sees why.
            self.say(f"member {self.member_id}: output {name} was never registered: {reason}")
            outcome = await asyncio.to_thread(
                refuse_output, self.access(), self.member_id, item["output"], reason
            )
        else:
            outcome = await asyncio.to_thread(fail_artifact, self.access(), int(item["artifact_id"]), reason)
        if outcome.state == "retry":
            # Keep the reason of the give-up; only the marking itself is retried.
            return Outcome("retry", item["error"], outcome.artifact_id)
        return outcome
