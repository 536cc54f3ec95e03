"""Report kinds agents may send, each dispatched to one stored function.

Every function has the signature `fn(p_node_id bigint, p_epoch bigint, p_payload jsonb) RETURNS jsonb`,
refuses a replaced session (require_node_session) and is idempotent, because a report can arrive twice.
Other areas add their kinds here, one line each (the launch issue: member prepared/failed/running/…).
"""

from __future__ import annotations

from typing import Any

from tuneplane.app import db_functions as fn
from tuneplane.app.errors import Refusal
from tuneplane.app.node_gateway.aiodb import AsyncDatabase, jsonb
from tuneplane.app.node_gateway.report_batch import BATCHED_KINDS, batcher

REPORT_FUNCTIONS: dict[str, str] = {
    "capacity": fn.report_node_capacity,
    "note": fn.record_node_note,
    # Launch (issue 5): a bounded chunk of a member's stdout/stderr (0045_member_logs.sql).
    "member_log": fn.member_log,
}


def register_report(kind: str, function: str) -> None:
    REPORT_FUNCTIONS[kind] = function


async def dispatch_report(db: AsyncDatabase, node_id: int, epoch: int, kind: str, payload: dict) -> Any:
    function = REPORT_FUNCTIONS.get(kind)
    if function is None:
        raise Refusal(f"unknown report kind {kind!r}", status=400, field="kind")
    if kind in BATCHED_KINDS:  # a gang's burst of them: recorded together (report_batch.py)
        return await batcher(db).submit(function, node_id, epoch, payload)
    # Every report function is idempotent: a deadlock victim or serialization failure is run again here
    # (bounded, logged) rather than sent back to the agent as a retryable 503.
    row = (await db.call_retrying(function, node_id, epoch, jsonb(payload)))[0]
    return next(iter(row.values()))
