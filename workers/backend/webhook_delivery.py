"""Team webhook delivery (docs/teams.md "Webhooks"): the loop that sends what enqueue_team_event queued in
the transactions that changed a job's state. It claims due deliveries (claim_team_event_deliveries), POSTs
each signed event outside any transaction, and reports what the receiver answered
(team_event_delivery_result), which decides delivered, another try after a back-off, or given up. Every
rule (what is due, the back-off, when to give up) is in sql/functions/team_events.sql; this only sends.

Runs in the backend worker beside its placement loop (delivered and given-up rows are pruned by the sweep
prune_team_event_deliveries, workers/sweeps.py); several workers may run it (claims are
FOR UPDATE SKIP LOCKED, and a claim whose worker died expires so that another one sends it again: at least
once, with the same event id)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
import urllib.error
import urllib.request
from collections.abc import Callable

import psycopg

from tuneplane.app import db_functions as fn
from tuneplane.app import webhook_targets
from tuneplane.app.errors import Refusal, clip
from tuneplane.app.node_gateway.aiodb import AsyncDatabase
from tuneplane.app.webhook_signature import EVENT_ID_HEADER, EVENT_KIND_HEADER, SIGNATURE_HEADER, sign

log = logging.getLogger("tuneplane.webhooks")

CHANNEL = "tuneplane_team_events"
# Deliveries one claim takes (sent concurrently).
BATCH = 16


def post_event(
    url: str, secret: str, body: dict, timeout: float, policy: webhook_targets.Policy | None = None
) -> tuple[int | None, str | None]:
    """One POST of a signed event: (HTTP status, None) or (None, the coarse class of why no status came
    back: refused by policy, connection failed, TLS failed, timeout). The target policy is applied where
    the connection is made (app/webhook_targets.py), to the address actually connected to."""
    policy = webhook_targets.current_policy() if policy is None else policy
    try:
        webhook_targets.check_url(url, policy)
    except webhook_targets.TargetRefused as exc:
        log.warning("webhook to %s refused: %s", clip(url, 200), exc)
        return None, webhook_targets.REFUSED
    data = json.dumps(body, separators=(",", ":"), sort_keys=True).encode()
    request = urllib.request.Request(
        url,
        data=data,
        method="POST",
        headers={
            "Content-Type": "application/json",
            "User-Agent": "TunePlane-Webhook/1",
            SIGNATURE_HEADER: sign(secret, data),
            EVENT_ID_HEADER: str(body["id"]),
            EVENT_KIND_HEADER: str(body["kind"]),
        },
    )
    try:
        with webhook_targets.opener(policy).open(request, timeout=timeout) as response:
            response.read(65536)
            return response.status, None
    except urllib.error.HTTPError as exc:
        return exc.code, None
    except (webhook_targets.TargetRefused, urllib.error.URLError, OSError, ValueError) as exc:
        # The operator's log keeps the detail; the team's page gets the class only.
        log.info("webhook to %s failed: %s", clip(url, 200), clip(f"{type(exc).__name__}: {exc}", 300))
        return None, webhook_targets.failure_class(exc)


class WebhookDeliverer:
    def __init__(self, db: AsyncDatabase, owner: str, *, poll_interval: float = 1.0,
                 say: Callable[[str], None] = print) -> None:  # fmt: skip
        self.db = db
        self.owner = owner
        self.poll_interval = poll_interval
        self.say = say
        self.wake = asyncio.Event()
        self.policy = webhook_targets.current_policy()

    async def deliver_due(self) -> int:
        """Claims and sends one batch of due deliveries; returns how many were tried."""
        claimed = await self.db.call(fn.claim_team_event_deliveries, self.owner, BATCH)
        await asyncio.gather(*(self._send(row) for row in claimed))
        return len(claimed)

    async def _send(self, row: dict) -> None:
        started = time.monotonic()
        status, error = await asyncio.to_thread(
            post_event, row["url"], row["secret"], row["body"], row["timeout_s"], self.policy
        )
        elapsed_ms = int((time.monotonic() - started) * 1000)
        state = (
            await self.db.call_one(
                fn.team_event_delivery_result, row["delivery_id"], row["attempt"], status, error, elapsed_ms
            )
        )["team_event_delivery_result"]
        if state == "gave_up":
            self.say(f"webhook: gave up event {row['event_id']} ({row['kind']}) after {row['attempt']} tries")

    async def run(self, stop: asyncio.Event) -> None:
        """Sends until stop: whenever woken (NOTIFY from enqueue_team_event, or a retry falling due within
        the poll interval), never letting a failure end the loop."""
        while not stop.is_set():
            try:
                while await self.deliver_due() == BATCH and not stop.is_set():
                    pass
            except (psycopg.Error, OSError, Refusal) as exc:
                log.warning("webhook delivery pass failed: %s", exc)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.wake.wait(), self.poll_interval)
            self.wake.clear()
