"""The agent's record of each member it prepares or runs: one JSON file per member in the state
directory (`<state-dir>/members/<id>.json`, written whole: a temporary file and a rename, or in place within
one page), so an agent restarted after kill -9 still knows which runner pid belongs to which member and
what it has not yet told the control plane.

The member's own files live under the work directory (`<work-dir>/members/<id>/`, see docs/launch.md).
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from tuneplane.workers.agent.directories import AgentPaths


def member_dir(paths: AgentPaths, member_id: int) -> Path:
    """The member directory (not created): what the runner gets as --member-dir, where logs/ lives."""
    return paths.work_dir / "members" / str(int(member_id))


def member_tag(paths: AgentPaths, member_id: int) -> str:
    """A marker unique to this member on this machine, put into the environment of its processes."""
    return member_tag_in(paths.work_dir, member_id)


def member_tag_in(work_dir: Path, member_id: int) -> str:
    return f"m{int(member_id)}.{hashlib.sha256(str(work_dir).encode()).hexdigest()[:12]}"


def tag_suffix(paths: AgentPaths) -> str:
    return member_tag(paths, 0).split(".", 1)[1]


@dataclass
class MemberRecord:
    member_id: int
    attempt_id: int
    job_id: int
    attempt: int
    rank: int
    # preparing | prepared | failed | running | ended
    state: str = "preparing"
    reason: str = ""
    pid: int | None = None
    pid_started: int | None = None
    collector_pid: int | None = None
    collector_started: int | None = None
    exit_code: int | None = None
    # The member's end, recorded before anything else happens after it (wall clock, seconds).
    ended_at: float | None = None
    # Reports not yet acknowledged by the control plane, by kind (sent again after a reconnect).
    unreported: dict[str, dict[str, Any]] = field(default_factory=dict)
    # PREPARE's payload while preparing: an agent restarted mid-prepare starts the preparation again.
    prepare_payload: dict[str, Any] | None = None
    # Outputs to deliver after an exit 0 (workers.agent.delivery): name → state, tries, error, artifact id.
    deliveries: dict[str, dict[str, Any]] = field(default_factory=dict)
    deliver_by: float | None = None


def pending(record: MemberRecord) -> list[str]:
    """The outputs still to deliver (or to give up on)."""
    return [name for name, d in (record.deliveries or {}).items() if d["state"] in ("pending", "failing")]


def settled(record: MemberRecord) -> bool:
    """The agent is done with the member: it ended, its end was reported and acknowledged, and its outputs
    were delivered or given up (the record may be forgotten, its directory removed in time)."""
    return record.state == "ended" and not record.unreported and not pending(record)


# A record rewritten in place fits one page: the kernel copies a page into the page cache whole, so a writer
# killed mid-write leaves the old record or the new one, never a mix.
IN_PLACE_LIMIT = 4096


def _rewrite_in_place(path: Path, data: bytes) -> bool:
    """Overwrite an existing record of at most one page with `data` (padded with spaces to the old length,
    which JSON ignores), without a temporary file and a rename: on ext4 a rename over an existing file starts
    the new file's writeback and waits for a journal handle, several milliseconds on the event loop of a
    node whose disk is busy (docs/launch.md). False when the record does not exist yet or would not fit
    one page: the caller writes it whole and renames. Raises OSError as a failed write would."""
    if len(data) > IN_PLACE_LIMIT:
        return False
    try:
        fd = os.open(path, os.O_WRONLY)
    except FileNotFoundError:
        return False
    try:
        size = os.fstat(fd).st_size
        if size > IN_PLACE_LIMIT:
            return False
        padded = data.ljust(size, b" ")
        if os.pwrite(fd, padded, 0) != len(padded):  # one page: all or nothing, but never assume
            raise OSError(f"short write of {path}")
    finally:
        os.close(fd)
    return True


class MemberStore:
    def __init__(self, directory: Path) -> None:
        self.directory = directory
        directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.records: dict[int, MemberRecord] = {}
        for path in sorted(directory.glob("*.json")):
            try:
                record = MemberRecord(**json.loads(path.read_text()))
            except (OSError, ValueError, TypeError):
                continue
            self.records[record.member_id] = record

    def get(self, member_id: int) -> MemberRecord | None:
        return self.records.get(int(member_id))

    def all(self) -> list[MemberRecord]:
        return list(self.records.values())

    def save(self, record: MemberRecord, sync: bool = True) -> None:
        """Keep the record (in memory at once) and write it atomically. Raises OSError when the directory
        cannot take it (a full disk): the file keeps its previous content, no partial temp file is left.

        `sync=False` (the launch's records: preparing, prepared, failed to prepare, running, the collector's
        pid) leaves out the fsync. What they guard against is the agent's own end (kill -9, an upgrade),
        and the page cache outlives that; a crash of the machine ends the member's processes with it, so a
        launch record kept through one would only name processes that are gone (the member is reported
        lost either way, docs/launch.md). Each fsync is a journal commit that every other writer on the
        filesystem waits behind: eight members preparing at once on one disk queued 24 of them. A record
        of an ended member is fsync'd whatever the caller says (the collector a drain spawns records its pid
        in one): work that finished must survive the machine, and a rename not preceded by an fsync may
        leave an empty file after a power loss on some filesystems. Such a launch write to a record that
        exists and fits a page rewrites it in place (_rewrite_in_place: whole as far as the agent's own end
        goes, and without the rename). ADR 0260."""
        self.records[record.member_id] = record
        path = self.directory / f"{record.member_id}.json"
        tmp = path.with_name(path.name + ".tmp")
        data = json.dumps(asdict(record)).encode()
        if not sync and record.state != "ended" and _rewrite_in_place(path, data):
            return
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            try:
                view = memoryview(data)
                while view:  # a write may take only part (the disk filling up); the rest or ENOSPC follows
                    view = view[os.write(fd, view) :]
                if sync or record.state == "ended":  # an end record is always made durable
                    os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(tmp, path)
        except OSError:
            tmp.unlink(missing_ok=True)
            raise

    def keep(self, record: MemberRecord, sync: bool = True) -> OSError | None:
        """save(), but a directory that cannot take the record (a full disk) is returned, not raised: the
        record in memory goes on (a member's reports and deliveries never wait on the disk)."""
        try:
            self.save(record, sync)
        except OSError as exc:
            return exc
        return None

    def forget(self, member_id: int) -> None:
        self.records.pop(int(member_id), None)
        (self.directory / f"{int(member_id)}.json").unlink(missing_ok=True)
