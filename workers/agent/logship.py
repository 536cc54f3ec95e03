"""Ship a member's stdout and stderr to the server as `member_log` reports over the control session.

The runner appends the workload's output to `<member dir>/logs/stdout.log` and `stderr.log` (docs/launch.md).
`ship_logs` tails both files and sends each new piece (at most `chunk_bytes` of the file, cut at a UTF-8
character boundary) as {member_id, stream, offset, length, text}. The server stores a chunk only at the
offset it expects next and answers that offset, so a resend stores nothing twice and a shipper that starts
again from 0 (after an agent restart) skips what the server already holds without re-reading it twice.

Usage from the start handler (one task per member, started with the runner):

    stop = asyncio.Event()
    shipper = asyncio.create_task(ship_logs(ctx, member_id, member_dir / "logs", stop))
    ...  # the runner exits
    stop.set()
    await shipper            # drains what is left (bounded by drain_timeout) before member_exited is sent

Reporting the member's end only after the drain means a reader who sees the member ended has every line.
"""

from __future__ import annotations

import asyncio
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path

from tuneplane.workers.agent.handlers import AgentContext
from tuneplane.workers.agent.session import Refused

log = logging.getLogger("tuneplane.agent.logs")

STREAMS = ("stdout", "stderr")
REPORT_KIND = "member_log"


@dataclass
class StreamState:
    name: str
    path: Path
    offset: int = 0
    shipped_bytes: int = 0
    gave_up: str | None = None


@dataclass
class ShipResult:
    member_id: int
    streams: dict[str, StreamState] = field(default_factory=dict)
    reports: int = 0
    unshipped: dict[str, int] = field(default_factory=dict)


def utf8_cut(data: bytes) -> int:
    """How many leading bytes of `data` end on a character boundary (an incomplete last character is
    held back until its remaining bytes arrive)."""
    end = len(data)
    # A UTF-8 character is at most 4 bytes: look back at most 3 for the start of the last one.
    for back in range(1, min(4, end) + 1):
        byte = data[end - back]
        if byte & 0xC0 == 0x80:  # continuation byte
            continue
        if byte < 0x80:
            return end
        need = 2 if byte & 0xE0 == 0xC0 else 3 if byte & 0xF0 == 0xE0 else 4 if byte & 0xF8 == 0xF0 else 1
        return end if back >= need else end - back
    return end


def decode_chunk(data: bytes) -> str:
    # PostgreSQL text cannot hold NUL; one replacement character per NUL keeps the output readable.
    return data.decode("utf-8", errors="replace").replace("\x00", "\ufffd")


def read_piece(path: Path, offset: int, limit: int, final: bool) -> bytes:
    """Up to `limit` bytes of `path` from `offset`; cut at a character boundary unless `final`."""
    try:
        with open(path, "rb") as handle:
            handle.seek(offset)
            data = handle.read(limit)
    except FileNotFoundError:
        return b""
    if not data or final:
        return data
    cut = utf8_cut(data)
    if cut == 0 and len(data) >= 4:
        return data  # not UTF-8 at all: ship it (decoded with replacements) rather than stall
    return data[:cut]


async def ship_logs(
    ctx: AgentContext,
    member_id: int,
    logs_dir: str | os.PathLike,
    stop_event: asyncio.Event,
    *,
    interval: float = 0.25,
    chunk_bytes: int = 64 * 1024,
    drain_timeout: float = 15.0,
    report_timeout: float = 30.0,
) -> ShipResult:
    """Tail the member's log files until `stop_event` is set, then ship what is left and return.

    Never raises for a lost connection (it waits for the next session: `ctx.report` follows it) nor for a
    refusal: a stream the server refuses (the member is not on this node) is given up and logged.
    """
    logs = Path(logs_dir)
    result = ShipResult(member_id)
    streams = [StreamState(name, logs / f"{name}.log") for name in STREAMS]
    result.streams = {s.name: s for s in streams}
    drain_deadline: float | None = None
    loop = asyncio.get_running_loop()
    backoff = interval
    while True:
        stopping = stop_event.is_set()
        if stopping and drain_deadline is None:
            drain_deadline = loop.time() + drain_timeout
        progressed = False
        disconnected = False
        for stream in streams:
            if stream.gave_up:
                continue
            piece = await asyncio.to_thread(read_piece, stream.path, stream.offset, chunk_bytes, stopping)
            if not piece:
                continue
            report = ctx.report
            if report is None:
                disconnected = True
                break
            payload = {
                "member_id": member_id,
                "stream": stream.name,
                "offset": stream.offset,
                "length": len(piece),
                "text": decode_chunk(piece),
            }
            try:
                answer = await report(REPORT_KIND, payload, timeout=report_timeout)
            except Refused as exc:
                if exc.status == 413 and chunk_bytes > 1024:
                    chunk_bytes //= 2  # the server allows less per chunk than we assumed
                    progressed = True
                    continue
                if exc.status in (400, 404, 413):
                    stream.gave_up = f"refused ({exc.status}): {exc.message}"
                    log.warning("member %s %s: log shipping stopped: %s", member_id, stream.name, exc.message)
                    continue
                disconnected = True  # 409: our session was replaced; the next one takes over
                break
            except (ConnectionError, TimeoutError, RuntimeError) as exc:
                log.info("member %s %s: log report not answered (%s); retrying", member_id, stream.name, exc)
                disconnected = True
                break
            result.reports += 1
            next_offset = int(answer.get("next_offset", stream.offset + len(piece)))
            if answer.get("stored"):
                stream.shipped_bytes += len(piece)
            stream.offset = next_offset
            if answer.get("why") == "over the limit":
                # The server keeps no more of this stream; sending the rest would only cost bandwidth.
                stream.gave_up = "over the server's per-stream log limit"
            progressed = True
        if disconnected:
            if drain_deadline is not None and loop.time() > drain_deadline:
                break
            await _wait(stop_event, backoff, stopping)
            backoff = min(backoff * 2, 2.0)
            continue
        backoff = interval
        if progressed:
            continue  # more may be waiting: read again at once
        if stopping:
            break  # drained: nothing left in either file
        await _wait(stop_event, interval, stopping)
    for stream in streams:
        size = await asyncio.to_thread(_size, stream.path)
        if size > stream.offset and not stream.gave_up:
            result.unshipped[stream.name] = size - stream.offset
    if result.unshipped:
        log.warning("member %s: log bytes not shipped: %s", member_id, result.unshipped)
    return result


async def _wait(stop_event: asyncio.Event, seconds: float, stopping: bool) -> None:
    if stopping:
        await asyncio.sleep(seconds)
        return
    try:
        await asyncio.wait_for(stop_event.wait(), seconds)
    except TimeoutError:
        pass


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0
