"""The durable spool: batches on private host-local disk between reading a file and the gateway's ack.

Modelled on Vector's disk buffer. Segment files hold framed records:

    b"TPS1" | u32 LE payload length | u32 masked CRC32C of the length | u32 masked CRC32C of the payload
            | payload

A payload is one of
    b"B" | u64 seq | u32 state length | state JSON | batch bytes   (a batch, the file positions after it)
    b"C" | state JSON                                                 (every position, at a segment's start)

File positions travel inside the same record as the points read up to them (one store, not two), so after a
crash the collector resumes reading exactly where its last durable batch ended. Each new segment starts with
a checkpoint of every file's position, so deleting fully acknowledged older segments never loses a position.

On open, a torn tail of the last segment (a frame cut short or garbage after the last good frame) is
truncated; a damaged frame with good frames after it is skipped and counted. The ack ledger holds the
highest acknowledged seq; it is synced before any segment is unlinked. Records are handed to the sender only
once fsynced (about once a second, at each roll, and at once when a sender would otherwise wait: it then
fsyncs the records itself), so a batch the gateway has seen is always still in the
spool after a crash, and its re-send carries the same seq and content (the gateway skips it).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import logging
import os
import struct
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from tuneplane.workers.collector.tfrecord import masked_crc32c

log = logging.getLogger(__name__)

FRAME_MAGIC = b"TPS1"
_FRAME = struct.Struct("<4sIII")
_BATCH_HEAD = struct.Struct("<cQI")
MAX_RECORD_BYTES = 128 * 1024 * 1024
SEGMENT_SUFFIX = ".seg"
# A write that fails for want of room: a new segment lets the acknowledged part of the current one go.
OUT_OF_ROOM = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG})
# Room held back while there is some (the emergency "ballast" of CockroachDB and others): on a disk too full
# for a new segment, it is let go so that the segment can be started and the acknowledged ones deleted.
RESERVE = "reserve"
RESERVE_BYTES = 64 * 1024


class SpoolInUse(Exception):
    """Another collector holds this spool directory."""


@dataclass
class PendingRecord:
    seq: int
    segment: Path
    offset: int  # of the batch bytes inside the segment file
    length: int
    frame_offset: int = 0  # the whole frame, to copy it when the spool is rebuilt
    frame_length: int = 0


@dataclass
class _Segment:
    path: Path
    number: int
    last_seq: int = 0  # highest batch seq inside (0: none)


@dataclass
class SpoolStats:
    corrupt_records: int = 0
    truncated_bytes: int = 0
    rejected: int = 0


def _frame(payload: bytes) -> bytes:
    length = struct.pack("<I", len(payload))
    return _FRAME.pack(FRAME_MAGIC, len(payload), masked_crc32c(length), masked_crc32c(payload)) + payload


def _write_all(fd: int, data: bytes) -> None:
    """os.write until all is written: a disk that fills mid-write gives a short write first, then ENOSPC."""
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class Spool:
    def __init__(
        self,
        directory: Path,
        *,
        segment_bytes: int = 16 * 1024 * 1024,
        fsync_interval: float = 1.0,
        max_bytes: int = 2 * 1024 * 1024 * 1024,
    ) -> None:
        self.dir = Path(directory)
        self.segment_bytes = segment_bytes
        self.fsync_interval = fsync_interval
        self.max_bytes = max_bytes
        self.stats = SpoolStats()
        self.file_states: dict[str, dict] = {}  # identity key "dev:ino" → checkpoint dict
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._segments: list[_Segment] = []
        # Unacknowledged records by seq, in order; those being sent right now are also in _in_flight.
        self._pending: dict[int, PendingRecord] = {}
        self._in_flight: set[int] = set()
        self._acked = 0
        self._next_seq = 1
        self._durable_seq = 0
        self._last_sync = 0.0
        self._fd: int | None = None
        self._size = 0
        self._total_bytes = 0
        self._ledger_error: str | None = None
        # A read descriptor per segment: batches are read through it, so a spool directory removed under a
        # running collector can be rebuilt from what it still holds (see _rebuild).
        self._read_fds: dict[Path, int] = {}
        self._dir_id: tuple[int, int] | None = None
        self._lock_fd: int | None = None
        self.collector_uuid = ""

    # ---------------------------------------------------------------- open and recovery
    def open(self) -> Spool:
        self.dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        self._take_lock()
        st = self.dir.stat()
        self._dir_id = (st.st_dev, st.st_ino)
        self.collector_uuid = self._load_uuid()
        self._acked = self._read_ledger()
        if not (self.dir / "acked").exists():
            try:  # made now, while there is room, so that a full disk later only overwrites it
                self._write_ledger(sync=True)
            except OSError as exc:
                self._ledger_trouble(exc)
        self._ensure_reserve()
        for path in self.dir.glob(f"*{SEGMENT_SUFFIX}"):
            if path.stem.isdigit():
                self._segments.append(_Segment(path, int(path.stem)))
        self._segments.sort(key=lambda s: s.number)
        for segment in self._segments:
            self._reader(segment.path)
        for index, segment in enumerate(self._segments):
            self._recover_segment(segment, last=index == len(self._segments) - 1)
        highest = max([self._acked, *(s.last_seq for s in self._segments)])
        self._next_seq = highest + 1
        self._durable_seq = highest
        self._total_bytes = sum(s.path.stat().st_size for s in self._segments)
        try:
            self._roll()  # a fresh segment that starts with a checkpoint of every position
        except OSError as exc:
            # A full disk must not keep the collector from starting: what is spooled can still be sent
            # (and acknowledged segments deleted); new batches go on at the end of the last segment.
            log.warning("spool: cannot start a new segment (%s); appending to the last one", exc.strerror)
            if self._segments:
                last = self._segments[-1]
                self._fd = os.open(last.path, os.O_WRONLY | os.O_APPEND)
                self._size = os.fstat(self._fd).st_size
        self._delete_acked_segments_or_wait()
        return self

    def _take_lock(self) -> None:
        """One collector per spool: a second one (an agent that lost the first one's pid, an operator) would
        read the same files from the same positions, number its batches like the first and delete
        segments the first still sends from. The lock (a POSIX record lock) goes with the process, kill -9
        included."""
        fd = os.open(self.dir / "lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
            os.close(fd)
            message = f"spool directory {self.dir} is in use by another collector (pid {holder})"
            raise SpoolInUse(message) from exc
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        if self._lock_fd is not None:
            os.close(self._lock_fd)
        self._lock_fd = fd

    def _load_uuid(self) -> str:
        path = self.dir / "collector.id"
        try:
            return path.read_text().strip()
        except FileNotFoundError:
            value = uuid.uuid4().hex
            self._write_uuid(value)
            return value

    def _write_uuid(self, value: str) -> None:
        path = self.dir / "collector.id"
        tmp = path.with_suffix(".tmp")
        tmp.write_text(value + "\n")
        os.replace(tmp, path)
        _fsync_dir(self.dir)

    def _read_ledger(self) -> int:
        try:
            raw = (self.dir / "acked").read_text().split()
        except FileNotFoundError:
            return 0
        if len(raw) == 2 and raw[0].isdigit() and raw[1] == f"{masked_crc32c(raw[0].encode()):08x}":
            return int(raw[0])
        log.warning("spool ack ledger damaged; re-sending all that is spooled (duplicates are skipped)")
        return 0

    def _write_ledger(self, sync: bool) -> None:
        """Overwrite the ledger in place with one fixed-width line (30 bytes, well inside one disk
        sector, which is written whole or not at all: PostgreSQL's pg_control relies on the same). An existing
        file needs no new block, so acks are recorded, and acknowledged segments deleted, while the disk is
        full. Before, a temporary file and a rename needed a free block: a spool acknowledged while its disk
        was full kept every segment, and once a page was free the next segment took it and every later
        write failed for good. The CRC still catches a damaged ledger (then everything is sent again)."""
        text = f"{self._acked:020d}".encode()
        line = text + b" " + f"{masked_crc32c(text):08x}".encode() + b"\n"
        fd = os.open(self.dir / "acked", os.O_WRONLY | os.O_CREAT, 0o600)
        try:
            size = os.fstat(fd).st_size
            created = size == 0
            os.pwrite(fd, line, 0)
            if size > len(line):  # an older ledger of another shape
                os.ftruncate(fd, len(line))
            if sync:
                os.fsync(fd)
        finally:
            os.close(fd)
        if created:
            _fsync_dir(self.dir)
        self._ledger_error = None

    @staticmethod
    def _find_next_frame(data: bytes, start: int) -> int | None:
        """The offset of the next intact frame at or after `start`, if there is one."""
        pos = data.find(FRAME_MAGIC, start)
        while pos >= 0:
            if _intact_frame_at(data, pos) is not None:
                return pos
            pos = data.find(FRAME_MAGIC, pos + 1)
        return None

    def _recover_segment(self, segment: _Segment, last: bool) -> None:
        data = segment.path.read_bytes()
        pos = 0
        while pos < len(data):
            payload = _intact_frame_at(data, pos)
            if payload is None:
                resume = self._find_next_frame(data, pos + 1)
                if resume is None:
                    if last:
                        # A torn tail: the writer died mid-frame. Everything before it is good.
                        self.stats.truncated_bytes += len(data) - pos
                        log.warning("spool: truncating a torn tail of %d bytes", len(data) - pos)
                        with open(segment.path, "r+b") as handle:
                            handle.truncate(pos)
                            os.fsync(handle.fileno())
                    else:
                        self.stats.corrupt_records += 1
                        log.error("spool: damaged end of %s skipped", segment.path)
                    break
                self.stats.corrupt_records += 1
                log.error("spool: damaged record at byte %d of %s skipped", pos, segment.path)
                pos = resume
                continue
            frame_end = pos + _FRAME.size + len(payload)
            self._apply_record(segment, payload, pos + _FRAME.size)
            pos = frame_end

    def _apply_record(self, segment: _Segment, payload: bytes, payload_offset: int) -> None:
        kind = payload[:1]
        if kind == b"C":
            self.file_states = json.loads(payload[1:])
            return
        if kind != b"B":
            self.stats.corrupt_records += 1
            return
        _, seq, state_len = _BATCH_HEAD.unpack_from(payload, 0)
        body_start = _BATCH_HEAD.size + state_len
        for key, state in json.loads(payload[_BATCH_HEAD.size : body_start]).items():
            self.file_states[key] = state
        segment.last_seq = max(segment.last_seq, seq)
        if seq > self._acked:
            self._pending[seq] = PendingRecord(
                seq,
                segment.path,
                payload_offset + body_start,
                len(payload) - body_start,
                payload_offset - _FRAME.size,
                _FRAME.size + len(payload),
            )

    # ---------------------------------------------------------------- writing
    def _roll(self) -> None:
        """Start a new segment with a checkpoint of every position. The current segment is synced first (the
        checkpoint may speak for its batches) and stays the one written to if the new one cannot be made."""
        if self._fd is not None:
            os.fsync(self._fd)
            self._durable_seq = self._next_seq - 1
            self._changed.notify_all()
        number = self._segments[-1].number + 1 if self._segments else 1
        path = self.dir / f"{number:012d}{SEGMENT_SUFFIX}"
        frame = _frame(b"C" + json.dumps(self.file_states, separators=(",", ":")).encode())
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o600)
        try:
            _write_all(fd, frame)
            os.fsync(fd)
            _fsync_dir(self.dir)
        except OSError:
            os.close(fd)
            with contextlib.suppress(OSError):
                path.unlink()
            raise
        if self._fd is not None:
            os.close(self._fd)
        self._fd = fd
        self._segments.append(_Segment(path, number))
        self._reader(path, opening=True)
        self._size = len(frame)
        self._total_bytes += len(frame)
        self._last_sync = time.monotonic()

    def _write_frame(self, frame: bytes, payload_len: int) -> None:
        """Append one frame whole or not at all (a failed write is cut off again)."""
        if self._fd is None or (self._size > _FRAME.size and self._size + payload_len > self.segment_bytes):
            self._roll()
        try:
            _write_all(self._fd, frame)  # type: ignore[arg-type]
        except OSError:
            with contextlib.suppress(OSError):
                os.ftruncate(self._fd, self._size)  # type: ignore[arg-type]
            raise

    def _make_room(self) -> bool:
        """Out of room: start a new segment (only when the current one holds batches, so a full disk does not
        make one segment per try) so that its acknowledged batches can be deleted now rather than at the
        next roll. True when a new segment was started."""
        if not self._segments or not self._segments[-1].last_seq:
            return False
        try:
            self._roll()
        except OSError as exc:
            # Without a new segment the last one (whose batches may all be acknowledged) can never go, and the
            # spool would stay full for good: the reserve makes room for the segment.
            if exc.errno not in OUT_OF_ROOM or not self._release_reserve():
                return False
            try:
                self._roll()
            except OSError:
                return False
        self._delete_acked_segments_or_wait()
        return True

    def _ensure_reserve(self) -> None:
        """Hold RESERVE_BYTES back while there is room (best effort: without room there is no reserve)."""
        path = self.dir / RESERVE
        if path.exists():
            return
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except OSError:
            return
        try:
            os.posix_fallocate(fd, 0, RESERVE_BYTES)
        except OSError:
            with contextlib.suppress(OSError):
                path.unlink()
        finally:
            os.close(fd)

    def _release_reserve(self) -> bool:
        try:
            (self.dir / RESERVE).unlink()
        except FileNotFoundError:
            return False
        log.warning("spool: the disk is full; its reserve makes room for a new segment")
        return True

    def _directory_gone(self) -> bool:
        try:
            st = self.dir.stat()
        except FileNotFoundError:
            return True
        return (st.st_dev, st.st_ino) != self._dir_id

    def _rebuild(self) -> None:
        """The spool directory was removed (or replaced) under the running collector: writes would go into
        unlinked files and the next restart would start an empty spool, read every file again from the
        start and store its points twice. Everything needed is still at hand: make the directory again with
        the same collector id, the ledger, and one segment holding every unacknowledged batch (copied
        through the read descriptors, with its seq) between two checkpoints of every file's position (the
        first for the segment-start rule, the last because the copied batches carry older positions)."""
        log.error("spool directory %s was removed while the collector ran; rebuilding it", self.dir)
        self.dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        try:
            self._take_lock()
        except SpoolInUse as exc:  # another collector started on the new directory meanwhile
            raise OSError(errno.EBUSY, str(exc)) from exc
        st = self.dir.stat()
        self._dir_id = (st.st_dev, st.st_ino)
        self._write_uuid(self.collector_uuid)
        self._write_ledger(sync=True)
        number = self._segments[-1].number + 1 if self._segments else 1
        path = self.dir / f"{number:012d}{SEGMENT_SUFFIX}"
        checkpoint = _frame(b"C" + json.dumps(self.file_states, separators=(",", ":")).encode())
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o600)
        try:
            parts, size, moved = [checkpoint], len(checkpoint), {}
            for seq, record in self._pending.items():
                reader = self._reader(record.segment)
                if reader is None:  # never opened (out of descriptors) and now gone with the directory
                    log.error("spool: batch %d was lost with the spool directory", seq)
                    continue
                frame = os.pread(reader, record.frame_length, record.frame_offset)
                within = record.offset - record.frame_offset
                moved[seq] = PendingRecord(seq, path, size + within, record.length, size, len(frame))
                parts.append(frame)
                size += len(frame)
            parts.append(checkpoint)
            _write_all(fd, b"".join(parts))
            os.fsync(fd)
            _fsync_dir(self.dir)
        except OSError:
            os.close(fd)
            raise
        for old in self._read_fds.values():
            os.close(old)
        if self._fd is not None:
            os.close(self._fd)
        self._read_fds = {}
        self._reader(path, opening=True)
        self._fd = fd
        self._segments = [_Segment(path, number, max(self._pending, default=0))]
        self._pending = moved
        self._size = self._total_bytes = size + len(checkpoint)
        self._durable_seq = self._next_seq - 1
        self._last_sync = time.monotonic()
        self._changed.notify_all()

    def append(self, batch: bytes, states: dict[str, dict]) -> int:
        """Spool one batch with the positions of the files it was read from; returns its seq."""
        with self._lock:
            if self._directory_gone():
                self._rebuild()
            seq = self._next_seq
            state_bytes = json.dumps(states, separators=(",", ":")).encode()
            payload = _BATCH_HEAD.pack(b"B", seq, len(state_bytes)) + state_bytes + batch
            if len(payload) > MAX_RECORD_BYTES:
                raise ValueError("batch too large for the spool")
            frame = _frame(payload)
            try:
                self._write_frame(frame, len(payload))
            except OSError as exc:
                # Nothing of the frame stays; the caller keeps the data (its files are the buffer).
                if exc.errno not in OUT_OF_ROOM or not self._make_room():
                    raise
                self._write_frame(frame, len(payload))
            frame_offset = self._size
            offset = self._size + _FRAME.size + _BATCH_HEAD.size + len(state_bytes)
            self._size += len(frame)
            self._total_bytes += len(frame)
            self._next_seq = seq + 1
            self._segments[-1].last_seq = seq
            self.file_states.update(states)
            self._pending[seq] = PendingRecord(
                seq, self._segments[-1].path, offset, len(batch), frame_offset, len(frame)
            )
            if self.fsync_interval <= 0:
                self._sync_locked()
            return seq

    def sync(self, force: bool = False) -> None:
        """fsync the current segment if records are waiting and the interval has passed, or at once when
        the senders have nothing durable left to send (or `force`)."""
        with self._lock:
            if self._directory_gone():
                # Also while nothing is appended: acks, rejections and a restart need the directory.
                try:
                    self._rebuild()
                except OSError as exc:
                    log.error("spool: cannot rebuild %s: %s", self.dir, exc.strerror)
            if self._durable_seq >= self._next_seq - 1:
                return
            starving = all(seq > self._durable_seq or seq in self._in_flight for seq in self._pending)
            if force or starving or time.monotonic() - self._last_sync >= self.fsync_interval:
                self._sync_locked()

    def _sync_locked(self) -> None:
        if self._fd is not None:
            os.fsync(self._fd)
        self._durable_seq = self._next_seq - 1
        self._last_sync = time.monotonic()
        self._changed.notify_all()

    @property
    def durable_seq(self) -> int:
        """The last seq known to be on disk (fsynced)."""
        return self._durable_seq

    @property
    def full(self) -> bool:
        return self._total_bytes >= self.max_bytes

    # ---------------------------------------------------------------- sending side
    def next_pending(self, timeout: float) -> PendingRecord | None:
        """The oldest durable, unacknowledged record not already being sent (waits up to `timeout`).
        The caller owns it until it calls ack() or release()."""
        deadline = time.monotonic() + timeout
        with self._lock:
            while True:
                for seq, record in self._pending.items():
                    if seq > self._durable_seq:
                        break
                    if seq not in self._in_flight:
                        self._in_flight.add(seq)
                        return record
                if self._durable_seq < self._next_seq - 1 and self._fd is not None:
                    # Records are waiting only for their fsync and this sender has nothing else to do:
                    # make them durable now rather than when the reader next finishes a chunk.
                    self._sync_locked()
                    continue
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return None
                self._changed.wait(remaining)

    def release(self, record: PendingRecord) -> None:
        """Sending failed: the record is offered again."""
        with self._lock:
            self._in_flight.discard(record.seq)
            self._changed.notify_all()

    def read(self, record: PendingRecord) -> bytes:
        # Under the lock: a rebuild closes the descriptors (a number reused meanwhile would read another
        # file's bytes).
        with self._lock:
            fd = self._reader(record.segment)
            if fd is None:  # moved by a rebuild: the sender is offered the record again
                raise FileNotFoundError(f"segment {record.segment} of batch {record.seq} was moved")
            return os.pread(fd, record.length, record.offset)

    def _reader(self, segment: Path, opening: bool = False) -> int | None:
        """The read descriptor of a segment, opened at its start (so that it outlives a removed directory)
        or, when that failed (out of descriptors), at its first read."""
        fd = self._read_fds.get(segment)
        if fd is None and (opening or any(s.path == segment for s in self._segments)):
            try:
                fd = self._read_fds[segment] = os.open(segment, os.O_RDONLY)
            except OSError as exc:
                log.warning("spool: cannot open %s for reading yet: %s", segment, exc.strerror)
        return fd

    def ack(self, seq: int) -> None:
        """The gateway stored (or had already stored) batch `seq`. The ledger records the highest seq below
        which everything is acknowledged (batches sent in parallel may be acknowledged out of order); a
        batch acknowledged above that mark is sent again after a crash, and the gateway skips it."""
        with self._lock:
            self._pending.pop(seq, None)
            self._in_flight.discard(seq)
            first = next(iter(self._pending), None)
            self._acked = max(self._acked, (first - 1) if first is not None else self._next_seq - 1)
            try:
                self._write_ledger(sync=False)
            except OSError as exc:
                # A full disk: the ack holds in memory; the ledger is written with the next ack or at close.
                self._ledger_trouble(exc)
            self._delete_acked_segments_or_wait()
            self._changed.notify_all()

    def reject(self, record: PendingRecord, reason: str) -> None:
        """The gateway refused the batch for good (malformed): keep a copy aside, then treat it as handled."""
        rejected = self.dir / "rejected"
        rejected.mkdir(exist_ok=True)
        (rejected / f"{record.seq:020d}.batch").write_bytes(self.read(record))
        (rejected / f"{record.seq:020d}.reason").write_text(reason + "\n")
        self.stats.rejected += 1
        self.ack(record.seq)

    def _ledger_trouble(self, exc: OSError) -> None:
        if self._ledger_error != exc.strerror:
            self._ledger_error = exc.strerror
            log.warning("spool: cannot write the ack ledger (%s); acknowledged segments stay until it can be "
                        "written", exc.strerror)  # fmt: skip

    def _delete_acked_segments_or_wait(self) -> None:
        """Delete what is acknowledged; when the ledger cannot be made durable (a full disk) nothing is
        deleted yet (a deletion the ledger does not vouch for could reuse sequence numbers after a crash)."""
        try:
            self._delete_acked_segments()
        except OSError as exc:
            self._ledger_trouble(exc)

    def _delete_acked_segments(self) -> None:
        removable = [s for s in self._segments[:-1] if s.last_seq <= self._acked]
        if not removable:
            return
        self._write_ledger(sync=True)  # the ledger is durable before anything it vouches for is unlinked
        for segment in removable:
            size = segment.path.stat().st_size
            segment.path.unlink()
            fd = self._read_fds.pop(segment.path, None)
            if fd is not None:
                os.close(fd)
            self._total_bytes -= size
            self._segments.remove(segment)
        _fsync_dir(self.dir)
        self._ensure_reserve()  # room again: hold some back for the next time the disk fills

    # ---------------------------------------------------------------- introspection
    def pending_count(self) -> int:
        with self._lock:
            return len(self._pending)

    def wait_all_acked(self, timeout: float) -> bool:
        """Until every record is acknowledged (each ack wakes this) or `timeout` seconds; True when none is
        pending."""
        end = time.monotonic() + timeout
        with self._changed:
            while self._pending:
                left = end - time.monotonic()
                if left <= 0:
                    return False
                self._changed.wait(left)
            return True

    @property
    def acked(self) -> int:
        return self._acked

    @property
    def last_seq(self) -> int:
        return self._next_seq - 1

    def segments(self) -> list[Path]:
        with self._lock:
            return [s.path for s in self._segments]

    def close(self) -> None:
        with self._lock:
            if self._fd is not None:
                fd, self._fd = self._fd, None
                try:
                    os.fsync(fd)
                    self._durable_seq = self._next_seq - 1
                    self._write_ledger(sync=True)
                except OSError as exc:
                    # The batches written and the acks already durable stand; the rest is re-sent.
                    log.warning("spool: closing without a final sync or ledger (%s)", exc.strerror)
                finally:
                    os.close(fd)
            for fd in self._read_fds.values():
                os.close(fd)
            self._read_fds.clear()
            if self._lock_fd is not None:
                os.close(self._lock_fd)
                self._lock_fd = None


def _intact_frame_at(data: bytes, pos: int) -> bytes | None:
    if len(data) - pos < _FRAME.size:
        return None
    magic, length, length_crc, payload_crc = _FRAME.unpack_from(data, pos)
    if magic != FRAME_MAGIC or length > MAX_RECORD_BYTES:
        return None
    if masked_crc32c(struct.pack("<I", length)) != length_crc:
        return None
    start = pos + _FRAME.size
    if start + length > len(data):
        return None
    payload = data[start : start + length]
    if masked_crc32c(payload) != payload_crc:
        return None
    return payload
