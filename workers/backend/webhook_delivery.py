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
from tuneplane.app.client.transport import ClientError, check_transport
from tuneplane.app.errors import Refusal
from tuneplane.app.node_gateway.aiodb import AsyncDatabase
from tuneplane.app.webhook_signature import EVENT_ID_HEADER, EVENT_KIND_HEADER, SIGNATURE_HEADER, sign

log = logging.getLogger("tuneplane.webhooks")

CHANNEL = "tuneplane_team_events"
# Deliveries one claim takes (sent concurrently).
BATCH = 16


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """A redirect is an answer, not a place to send the event (its target was never registered)."""

    def redirect_request(self, *args, **kwargs):
        return None


_opener = urllib.request.build_opener(_NoRedirect)


def post_event(url: str, secret: str, body: dict, timeout: float) -> tuple[int | None, str | None]:
    """One POST of a signed event: (HTTP status, None) or (None, why no status came back)."""
    try:
        check_transport(url)
    except ClientError as exc:
        return None, exc.message
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
        with _opener.open(request, timeout=timeout) as response:
            response.read(65536)
            return response.status, None
    except urllib.error.HTTPError as exc:
        return exc.code, None
    except (urllib.error.URLError, OSError, ValueError) as exc:
        reason = getattr(exc, "reason", exc)
        return None, f"{type(exc).__name__}: {reason}"[:500]


class WebhookDeliverer:
    def __init__(self, db: AsyncDatabase, owner: str, *, poll_interval: float = 1.0,
                 say: Callable[[str], None] = print) -> None:  # fmt: skip
        self.db = db
        self.owner = owner
        self.poll_interval = poll_interval
        self.say = say
        self.wake = asyncio.Event()

    async def deliver_due(self) -> int:
        """Claims and sends one batch of due deliveries; returns how many were tried."""
        claimed = await self.db.call(fn.claim_team_event_deliveries, self.owner, BATCH)
        await asyncio.gather(*(self._send(row) for row in claimed))
        return len(claimed)

    async def _send(self, row: dict) -> None:
        started = time.monotonic()
        status, error = await asyncio.to_thread(
            post_event, row["url"], row["secret"], row["body"], row["timeout_s"]
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
