"""Reports of one kind that arrive together, recorded together (issue 23).

When a gang prepares or starts, every agent sends its member_prepared (or member_started) within a few
milliseconds, and each report takes its job's lock: eight of them took eight turns, one after another, each
waiting for the previous commit. Here the first report of a kind goes to its own function at once (no added
wait when nothing else is in flight); the ones that arrive while it runs are sent next as one
`member_reports` call, one transaction that takes the locks once. Each report still gets its own result or
refusal. A batch that fails as a whole (a deadlock victim after its retries, a lost connection) is run item
by item, exactly as if it had never been batched; every report function is idempotent.
"""

from __future__ import annotations

import asyncio
import logging
import weakref
from dataclasses import dataclass, field
from typing import Any

import psycopg

from tuneplane.app import db_functions as fn
from tuneplane.app.errors import Refusal
from tuneplane.app.node_gateway.aiodb import AsyncDatabase, jsonb

log = logging.getLogger("tuneplane.node_gateway.reports")

BATCHED_KINDS = frozenset({"member_prepared", "member_started"})
MAX_BATCH = 256


@dataclass
class _Item:
    node_id: int
    epoch: int
    payload: dict
    done: asyncio.Future = field(default_factory=lambda: asyncio.get_running_loop().create_future())


class ReportBatcher:
    def __init__(self, db: AsyncDatabase) -> None:
        self.db = db
        self.waiting: dict[str, list[_Item]] = {}
        self.busy: set[str] = set()
        self.stats = {"reports": 0, "batches": 0, "batched_reports": 0}

    async def submit(self, function: str, node_id: int, epoch: int, payload: dict) -> Any:
        """The result of report function `function` (member_prepared or member_started) for one report."""
        item = _Item(node_id, epoch, payload)
        self.waiting.setdefault(function, []).append(item)
        self.stats["reports"] += 1
        if function not in self.busy:
            self.busy.add(function)
            asyncio.get_running_loop().create_task(self._drain(function), name=f"reports-{function}")
        return await item.done

    async def _drain(self, function: str) -> None:
        try:
            while self.waiting.get(function):
                queued = self.waiting[function]
                items, self.waiting[function] = queued[:MAX_BATCH], queued[MAX_BATCH:]
                try:
                    if len(items) == 1:
                        await self._one(function, items[0])
                    else:
                        await self._together(function, items)
                except Exception as exc:  # a bug here: answer every sender now, not at its 30 s timeout
                    log.exception("recording %d %s report(s) failed", len(items), function)
                    for item in items:
                        _settle(item, error=exc)
        finally:
            self.busy.discard(function)

    async def _one(self, function: str, item: _Item) -> None:
        try:
            row = (await self.db.call_retrying(function, item.node_id, item.epoch, jsonb(item.payload)))[0]
        except BaseException as exc:  # the report's own refusal or trouble, answered to its sender
            _settle(item, error=exc)
            if not isinstance(exc, Exception):
                raise
            return
        _settle(item, result=next(iter(row.values())))

    async def _together(self, function: str, items: list[_Item]) -> None:
        body = [{"node_id": i.node_id, "epoch": i.epoch, "payload": i.payload} for i in items]
        try:
            row = (await self.db.call_retrying(fn.member_reports, function, jsonb(body)))[0]
            outcomes = row["member_reports"]
        except (psycopg.Error, OSError, Refusal):
            for item in items:  # as if never batched
                await self._one(function, item)
            return
        self.stats["batches"] += 1
        self.stats["batched_reports"] += len(items)
        for item, outcome in zip(items, outcomes, strict=True):
            if "error" not in outcome:
                _settle(item, result=outcome["result"])
                continue
            error = outcome["error"]
            code = error.get("sqlstate") or ""
            if code.startswith("TP") and code[2:].isdigit():
                refusal = Refusal(error["message"], status=int(code[2:]), field=error.get("column"))
                _settle(item, error=refusal)
            elif code.startswith("22"):  # a value the agent sent that SQL cannot take
                _settle(item, error=Refusal(f"bad report payload: {error['message']}", status=400))
            else:  # anything else: that report alone, on its own, with the usual retries and errors
                await self._one(function, item)


def _settle(item: _Item, result: Any = None, error: BaseException | None = None) -> None:
    if item.done.done():  # its sender gave up waiting (the session closed)
        return
    if error is not None:
        item.done.set_exception(error)
    else:
        item.done.set_result(result)


_BATCHERS: weakref.WeakKeyDictionary[AsyncDatabase, ReportBatcher] = weakref.WeakKeyDictionary()


def batcher(db: AsyncDatabase) -> ReportBatcher:
    found = _BATCHERS.get(db)
    if found is None:
        found = _BATCHERS[db] = ReportBatcher(db)
    return found
