"""`tuneplane jobs logs`: one member's output as it is, or every member's with each line prefixed by its
rank (`[rank 1] …`), reading GET /jobs/<id>/logs in bounded pieces.

With several members a line is printed once it is complete (a piece may end mid-line), so lines of two
ranks never interleave within a line. --follow polls every member in turn until the job has finished,
and moves on to a retry's new attempt when every member of the followed attempt has ended.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import click

from tuneplane.app.client.http import ApiClient

TERMINAL = ("succeeded", "failed", "cancelled")
READ_BYTES = 256 * 1024


@dataclass
class MemberLog:
    rank: int
    prefix: str
    after: int = 0
    partial: str = ""
    complete: bool = False

    def emit(self, text: str, final: bool) -> None:
        if not self.prefix:
            click.echo(text, nl=False)
            return
        lines = (self.partial + text).split("\n")
        self.partial = lines.pop()  # the rest of an unfinished line (empty after a newline)
        for line in lines:
            click.echo(f"{self.prefix}{line}")
        if final and self.partial:
            click.echo(f"{self.prefix}{self.partial}")
            self.partial = ""


def _read(client: ApiClient, job_id: str, params: dict[str, Any]) -> dict:
    return client.get(f"/jobs/{job_id}/logs", params={k: v for k, v in params.items() if v is not None})


def _ranks(client: ApiClient, job_id: str, attempt: int | None) -> tuple[list[int], int | None]:
    """The ranks of `attempt` (default: the latest) and that attempt's number; [0] before any member."""
    job = client.get(f"/jobs/{job_id}")
    members = job.get("members") or []
    if attempt is None and members:
        attempt = max(m["attempt"] for m in members)
    ranks = sorted({m["rank"] for m in members if m["attempt"] == attempt})
    return ranks or [0], attempt


class LogReader:
    def __init__(self, client: ApiClient, job_id: str, stream: str, tail: int | None) -> None:
        self.client, self.job_id, self.stream, self.tail = client, job_id, stream, tail
        self.job_state: str | None = None

    def drain(self, member: MemberLog, attempt: int | None) -> None:
        """Print everything stored for `member` now; note whether it has ended and been read to the end."""
        while True:
            data = _read(
                self.client,
                self.job_id,
                {
                    "member": member.rank,
                    "stream": self.stream,
                    "after": member.after,
                    "limit": READ_BYTES,
                    "attempt": attempt,
                    "tail": self.tail if member.after == 0 else None,
                },
            )
            self.job_state = data["job_state"]
            member.complete = bool(data["complete"])
            text = "".join(chunk["text"] for chunk in data["chunks"])
            member.emit(text, final=member.complete)
            member.after = data["next"]
            if not data["more"]:
                return


def print_logs(
    client: ApiClient,
    job_id: str,
    *,
    rank: int | None,
    stream: str,
    attempt: int | None,
    tail: int | None,
    follow: bool,
    poll: float,
) -> None:
    """Print the logs of `rank` (None: every member of the attempt) of `attempt` (None: the latest)."""
    pinned = attempt
    reader = LogReader(client, job_id, stream, tail)
    shown: int | None = None
    members: dict[int, MemberLog] = {}
    while True:
        ranks, current = _ranks(client, job_id, pinned)
        if rank is not None:
            ranks = [rank]
        if current != shown:
            if members and shown is not None:
                for member in members.values():
                    member.emit("", final=True)
                click.echo(f"--- attempt {current} ---", err=True)
            members, shown = {}, current
        for r in ranks:
            members.setdefault(r, MemberLog(r, ""))
        for member in members.values():
            member.prefix = f"[rank {member.rank}] " if len(members) > 1 else ""
        for member in members.values():
            reader.drain(member, shown)
        if not follow:
            break
        if reader.job_state in TERMINAL:
            # Everything is stored once the job has finished (nodes ship the rest before the end):
            # one more pass picks up what arrived while the other members were read.
            for member in members.values():
                reader.drain(member, shown)
            break
        time.sleep(max(poll, 0.1))
    for member in members.values():
        member.emit("", final=True)
