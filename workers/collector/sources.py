"""Following the files in a member's output directory: which ones, where each one's reading stands, and the
points in the bytes written since.

A tracked file is keyed by its identity (device, inode, first-64-bytes hash), not its path, so a renamed
(rotated) file keeps its offset and source while a new file at the old path starts from 0. The file stays
open while tracked, so a file deleted before it was fully read is still read to its end.
"""

from __future__ import annotations

import errno
import logging
import os
import re
import stat
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from tuneplane.app.telemetry import wire
from tuneplane.workers.collector import jsonl, tfrecord
from tuneplane.workers.collector.columns import Parsed, PointColumns, Series
from tuneplane.workers.collector.file_identity import FileIdentity, identify, still_same
from tuneplane.workers.collector.points import Point

READ_CHUNK = 8 * 1024 * 1024
# A file's first read is smaller, then each read doubles up to READ_CHUNK: the first batch of a new file
# leaves before 8 MiB are read and split.
FIRST_READ = 1024 * 1024
NOT_AN_EVENT = "record is not a TensorBoard event"
LINE_TOO_LONG = f"line longer than {READ_CHUNK} bytes"

log = logging.getLogger(__name__)
_CONTROL = re.compile("[\x00-\x1f\x7f]")


def classify(name: str) -> str | None:
    if "tfevents" in name:
        return "tensorboard"
    if name.endswith(".jsonl"):
        return "jsonl"
    stem, _, suffix = name.rpartition(".")
    if stem.endswith(".jsonl") and suffix.isdigit():
        return "jsonl"  # a rotated metrics.jsonl.1
    return None


def subrun_name(run_dir: str, tag: str) -> str:
    """The name of a scalar written by `add_scalars(main_tag, {key: value})`: PyTorch and tensorboardX
    write it into a sub-run directory `<main_tag with / as _>_<key>` under the tag `main_tag`, so the
    directory's suffix tells the scalars apart (`eval` in `eval_loss/` → `eval/loss`)."""
    prefix = tag.replace("/", "_") + "_"
    if run_dir.startswith(prefix) and len(run_dir) > len(prefix):
        return f"{tag}/{run_dir[len(prefix) :]}"
    return tag


def storable(relative: Path) -> str:
    """A path as text the gateway stores: bytes that are not UTF-8 (a Latin-1 file name; Python holds them
    as lone surrogates) become `\\xff`, control characters `\\x0a`. Otherwise every point of such a file
    would be refused for its source name."""
    text = os.fsencode(relative).decode("utf-8", "backslashreplace")
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", text)


def source_for(kind: str, relative: Path) -> str:
    if kind == "tensorboard":
        # A TensorBoard "run" is a directory; files of one run (one per writer restart) are one source.
        return f"tensorboard:{storable(relative.parent)}"
    name = storable(relative)
    stem, _, suffix = name.rpartition(".")
    if suffix.isdigit() and stem.endswith(".jsonl"):
        name = stem
    return f"jsonl:{name}"


@dataclass
class FileState:
    identity: FileIdentity
    kind: str
    source: str
    path: str
    offset: int = 0
    tags: dict[str, str] = field(default_factory=dict)
    bad_records: int = 0  # damaged regions and refused points or lines, for the health summary
    last_data_at: float | None = None

    def checkpoint(self) -> dict:
        return {
            "identity": self.identity.as_dict(),
            "kind": self.kind,
            "source": self.source,
            "path": self.path,
            "offset": self.offset,
            "tags": self.tags,
            "bad_records": self.bad_records,
            "last_data_at": self.last_data_at,
        }

    @classmethod
    def from_checkpoint(cls, data: dict) -> FileState:
        return cls(
            identity=FileIdentity.from_dict(data["identity"]),
            kind=data["kind"],
            source=data["source"],
            path=data["path"],
            offset=int(data["offset"]),
            tags=dict(data.get("tags") or {}),
            bad_records=int(data.get("bad_records") or 0),
            last_data_at=data.get("last_data_at"),
        )


# A batch carries at most this many refusal and damage entries (the gateway refuses a batch with more than
# wire.MAX_ENTRIES as malformed, and with it every point of the batch).
MAX_ENTRIES = wire.MAX_ENTRIES // 10
OTHER_NAMES = "(other names)"


def _fold_refused(refused: dict[tuple[str, str], int]) -> dict[tuple[str, str], int]:
    """Refusals beyond MAX_ENTRIES distinct (name, reason) pairs (a line per step logging a new text field)
    are counted under the name `(other names)` per reason: every refusal stays counted."""
    if len(refused) <= MAX_ENTRIES:
        return refused
    kept = dict(list(refused.items())[: MAX_ENTRIES - 64])
    for (_, reason), n in list(refused.items())[MAX_ENTRIES - 64 :]:
        kept[(OTHER_NAMES, reason)] = kept.get((OTHER_NAMES, reason), 0) + n
    return kept


def _fold_damage(damage: list[tfrecord.Damage]) -> list[tfrecord.Damage]:
    """Damaged regions beyond MAX_ENTRIES (every other record of a file with a bad CRC) become one region
    per reason that spans them, its reason saying how many there were: the batch stays one the gateway
    takes (before, its points were refused with it) and the damage stays shown."""
    if len(damage) <= MAX_ENTRIES:
        return damage
    kept = damage[: MAX_ENTRIES - 64]
    spans: dict[str, list[int]] = {}
    for d in damage[MAX_ENTRIES - 64 :]:
        span = spans.setdefault(d.reason, [d.offset, d.offset + d.length, 0])
        span[0], span[1], span[2] = min(span[0], d.offset), max(span[1], d.offset + d.length), span[2] + 1
    for reason, (start, stop, n) in spans.items():
        kept.append(tfrecord.Damage(start, stop - start, f"{reason}: {n} damaged regions in this span"))
    return kept


@dataclass
class Chunk:
    """Points read from one file, by series (name → steps, values, wall times as numpy columns), and the
    offset just past the last unit (line or record) they came from, with what was refused (name, reason →
    count) and the damaged regions skipped in those bytes."""

    state: FileState
    end_offset: int
    series: Series
    count: int
    refused: dict[tuple[str, str], int] = field(default_factory=dict)
    damage: list[tfrecord.Damage] = field(default_factory=list)

    @property
    def news(self) -> bool:
        """Anything to spool: points, refusals or damage."""
        return bool(self.count or self.refused or self.damage)

    @property
    def points(self) -> list[Point]:
        source = self.state.source
        return [
            Point(source, name, step, wall, value)
            for name, (steps, values, walls) in self.series.items()
            for step, value, wall in zip(steps.tolist(), values.tolist(), walls.tolist(), strict=True)
        ]


class OutputTracker:
    """The member's metric files, each read from where its reading stands.

    At most `max_open` files are held open. With more files than that (one SummaryWriter per trial: hundreds
    or thousands of event files), files read to their end are closed, least recently read first, and opened
    again by identity when they grow. A file that cannot be looked at or read (no permission, a symlink
    loop, an I/O error) is skipped and tried again on the next poll: one bad file never stops the others.
    """

    def __init__(
        self, root: Path, states: dict[tuple[int, int], FileState] | None = None, max_open: int = 512
    ) -> None:
        self.root = root
        self.states: dict[tuple[int, int], FileState] = dict(states or {})
        # Open files, least recently read first.
        self.handles: dict[tuple[int, int], int] = {}
        self.read_sizes: dict[tuple[int, int], int] = {}
        self.max_open = max(1, max_open)
        # Files that have grown (or are new) while closed and wait for a free handle.
        self.waiting: set[tuple[int, int]] = set()
        self._evicted: set[tuple[int, int]] = set()  # closed by us while read to their end
        self._errors: dict[str, str] = {}  # path → the last error said about it (said once)
        # Files that hold bytes this collector could not read (path → source, offset, bytes, reason): at the
        # member's end they are reported as damage, so the loss is shown, not only logged.
        self.unreadable: dict[str, tuple[str, int, int, str]] = {}

    def close(self) -> None:
        for fd in self.handles.values():
            os.close(fd)
        self.handles.clear()

    def _relative(self, path: str | Path) -> str:
        try:
            return storable(Path(path).relative_to(self.root))
        except ValueError:
            return storable(Path(path))

    def _trouble(
        self, path: str, exc: OSError, source: str | None = None, offset: int = 0, size: int = 0
    ) -> None:
        """Say once per file and kind of error that a file is skipped for now; remember what it holds."""
        message = f"{exc.strerror or exc}"
        if self._errors.get(path) != message:
            self._errors[path] = message
            log.warning("metrics file %s skipped for now: %s", path, message)
        if source is not None and size > offset:
            self.unreadable[path] = (source, offset, size - offset, message)

    def _readable(self, path: str) -> None:
        self._errors.pop(path, None)
        self.unreadable.pop(path, None)

    def _candidates(self, failed: list[OSError]) -> Iterator[tuple[Path, str]]:
        # A directory that cannot be listed (out of descriptors, no permission) is said, not silently empty.
        def listing_failed(exc: OSError) -> None:
            failed.append(exc)
            self._trouble(self._relative(exc.filename or self.root), exc)

        for dirpath, dirnames, filenames in os.walk(self.root, onerror=listing_failed):
            dirnames.sort()
            for name in sorted(filenames):
                kind = classify(name)
                if kind is not None:
                    yield Path(dirpath) / name, kind

    def discover(self) -> None:
        """Open files not yet tracked; notice recycled inodes; pick up states restored from the spool; open
        again a closed file that has grown."""
        seen: set[tuple[int, int]] = set()
        failed: list[OSError] = []
        self.waiting.clear()
        while len(self.handles) > self.max_open and self._close_idle():
            pass
        for path, kind in self._candidates(failed):
            try:
                st = path.stat()
            except FileNotFoundError:
                continue
            except OSError as exc:  # a symlink loop, no permission, a name too long, an I/O error
                self._trouble(self._relative(path), exc)
                failed.append(exc)
                continue
            if not stat.S_ISREG(st.st_mode):
                continue  # a FIFO named metrics.jsonl would block the open (and the collector) for ever
            key = (st.st_dev, st.st_ino)
            seen.add(key)
            state = self.states.get(key)
            if state is not None and (key in self.handles or st.st_size == state.offset):
                # Open already, or closed (or restored from the spool) and read to its end: nothing to open.
                state.path = storable(path.relative_to(self.root))
                if key not in self.handles:
                    self._evicted.add(key)
                continue
            if len(self.handles) >= self.max_open and not self._close_idle():
                self.waiting.add(key)
                continue
            self._open(path, kind, key, failed, st.st_size)
        if not failed:
            # Files closed while read to their end that are gone from the directory are forgotten.
            for key in self._evicted - seen:
                self._evicted.discard(key)
                self.states.pop(key, None)

    def _open(self, path: Path, kind: str, key: tuple[int, int], failed: list[OSError], size: int) -> None:
        relative = path.relative_to(self.root)
        where, source = storable(relative), source_for(kind, relative)
        try:
            # O_NONBLOCK: a regular file swapped for a FIFO since the stat must not block the open.
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
        except FileNotFoundError:
            return
        except OSError as exc:
            if exc.errno in (errno.EMFILE, errno.ENFILE):
                # Out of descriptors (other parts of the collector hold some too): hold fewer files open,
                # leaving room for listing directories, the spool and the sender's connections.
                self.max_open = max(1, len(self.handles) - 16)
                self.waiting.add(key)
                self._trouble(where, exc)
            else:
                self._trouble(where, exc, source, self._offset(key), size)
            failed.append(exc)
            return
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                os.close(fd)
                return
            known = self.states.get(key)
            if known is not None:
                same = still_same(known.identity, fd)
                if same is None:
                    known = None  # the inode was recycled for a new file
                else:
                    known.identity = same
                    known.path = where
            if known is None:
                self.states[key] = FileState(identify(fd), kind, source, where)
        except OSError as exc:
            os.close(fd)
            self._trouble(where, exc, source, self._offset(key), size)
            failed.append(exc)
            return
        self.handles[key] = fd
        self._evicted.discard(key)
        self._readable(where)

    def _offset(self, key: tuple[int, int]) -> int:
        state = self.states.get(key)
        return state.offset if state is not None else 0

    def _close_idle(self) -> bool:
        """Close the least recently read file that is read to its end; False when every open file still
        has bytes to read."""
        for key, fd in self.handles.items():
            try:
                idle = os.fstat(fd).st_size == self.states[key].offset
            except OSError:
                idle = False
            if idle:
                os.close(fd)
                del self.handles[key]
                self.read_sizes.pop(key, None)
                self._evicted.add(key)
                return True
        return False

    def _forget_gone(self, key: tuple[int, int], fd: int) -> bool:
        """Close and forget a file that was deleted and has been read to its end."""
        if os.fstat(fd).st_nlink == 0:
            os.close(fd)
            del self.handles[key]
            del self.states[key]
            self.read_sizes.pop(key, None)
            return True
        return False

    def unread(self) -> bool:
        """Whether any tracked file holds bytes past its position (the drain reads until it does not),
        counting files that wait to be opened again."""
        if self.waiting:
            return True
        for key, fd in self.handles.items():
            try:
                if os.fstat(fd).st_size > self.states[key].offset:
                    return True
            except OSError:
                continue
        return False

    def read(self, max_points: int, final: bool = False) -> Iterator[Chunk]:
        """New points of every file. `final`: the writer is gone, so a cut-short tail is damage (a
        TensorBoard record) or a last line without its newline (JSONL), not something to wait for."""
        for key, fd in list(self.handles.items()):
            state = self.states[key]
            try:
                got = self._next_bytes(key, fd, state)
            except OSError as exc:  # an I/O error on one file: the others are read, this one again later
                try:
                    size = os.fstat(fd).st_size
                except OSError:
                    size = 0
                self._trouble(state.path, exc, state.source, state.offset, size)
                continue
            if state.path in self._errors:
                self._readable(state.path)
            if got is None:
                continue
            data, size = got
            # Least recently read first: an idle file is the one closed when handles run short.
            self.handles[key] = self.handles.pop(key)
            at_end = final and state.offset + len(data) >= size
            if state.kind == "tensorboard":
                more = state.offset + len(data) < size
                yield from self._read_tensorboard(state, data, max_points, at_end, more)
            else:
                full_chunk = len(data) == READ_CHUNK
                yield from self._read_jsonl(state, data, max_points, full_chunk, at_end)

    def _next_bytes(self, key: tuple[int, int], fd: int, state: FileState) -> tuple[bytes, int] | None:
        """The next bytes of one file to decode and the file's size, or None when it has nothing new."""
        size = os.fstat(fd).st_size
        if size < state.offset:
            # Truncated in place (copytruncate rotation): start over from the beginning.
            state.offset = 0
        if size == state.offset:
            self._forget_gone(key, fd)
            return None
        same = still_same(state.identity, fd)
        if same is None:
            # Rewritten in place (the same inode, other first bytes: a script that writes its whole history
            # again, or copytruncate with the writer already past the old position): read it from the
            # start. Before, reading went on at the old position, in the middle of a line of the new text.
            log.info("%s was rewritten in place; reading it again from the start", state.path)
            state.offset, same = 0, identify(fd)
        state.identity = same
        want = self.read_sizes.get(key, FIRST_READ)
        self.read_sizes[key] = min(READ_CHUNK, want * 2)
        data = os.pread(fd, min(want, size - state.offset), state.offset)
        if state.kind == "tensorboard":
            whole = tfrecord.record_size_at(data)
            if whole is not None and whole > len(data):
                # A record longer than one read (an image, a graph, up to MAX_RECORD_BYTES): read it
                # whole, or as much of it as the file holds; a window that never fits it would stop
                # the file at this record for ever.
                data = os.pread(fd, min(whole, size - state.offset), state.offset)
        return data, size

    def _read_tensorboard(
        self, state: FileState, data: bytes, max_points: int, final: bool, more: bool
    ) -> Iterator[Chunk]:
        # The protobuf parsers load with the first event file: a member that writes none (JSONL, or nothing)
        # starts its collector without them (ADR 0165).
        from tuneplane.workers.collector import tb_events

        found = tfrecord.scan(data, state.offset, final=final, more_to_read=more)
        columns = PointColumns()
        run_dir = Path(state.path).parent.name
        simple = tb_events.simple_scalars(found.data, found.starts, found.lengths)
        names = [subrun_name(run_dir, tag) for tag in simple.tags]
        units = np.flatnonzero(simple.matched)
        columns.add_many(units, names, simple.tag_ids, simple.steps, simple.values, simple.walls)
        damage = list(found.damage)
        ends = found.ends
        for unit in np.flatnonzero(~simple.matched).tolist():
            start, length = int(found.starts[unit]), int(found.lengths[unit])
            record, record_end = found.data[start : start + length], int(ends[unit])
            try:
                for tag, step, wall, value in tb_events.event_scalars(record, state.source, state.tags):
                    columns.add(unit, subrun_name(run_dir, tag), step, value, wall)
            except tb_events.EventDecodeError:
                damage.append(tfrecord.Damage(record_end - len(record) - 16, len(record) + 16, NOT_AN_EVENT))
        yield from self._chunks(state, columns.build(ends), state.offset + found.consumed, damage,
                                max_points)  # fmt: skip

    def _read_jsonl(
        self, state: FileState, data: bytes, max_points: int, full_chunk: bool, final: bool
    ) -> Iterator[Chunk]:
        lines = data.split(b"\n")
        torn = lines.pop()  # after the last newline: the writer is mid-line (or b"")
        ends = np.flatnonzero(np.frombuffer(data, dtype=np.uint8) == 0x0A) + (state.offset + 1)
        if final and torn:
            # The writer is gone: a last line without its newline is all it will ever write.
            lines.append(torn)
            ends = np.append(ends, state.offset + len(data))
        if not lines:
            if full_chunk:
                # One line longer than a whole chunk: not a metrics line; skip past it.
                columns = PointColumns()
                columns.refuse(0, "", LINE_TOO_LONG)
                end = state.offset + len(data)
                yield from self._chunks(state, columns.build([end]), end, [], max_points)
            return
        now = time.time()
        # Decoded a block of lines at a time, sized to make about one chunk, so that the first batch
        # leaves while the rest of the buffer is still to be read.
        block = max(64, max_points // 8)
        start = 0
        while start < len(lines):
            stop = min(len(lines), start + block)
            columns = PointColumns()
            jsonl.parse_lines(lines[start:stop], now, columns)
            parsed = columns.build(ends[start:stop])
            yield from self._chunks(state, parsed, int(ends[stop - 1]), [], max_points)
            per_line = max(1.0, len(parsed.units) / (stop - start))
            block = max(64, int(max_points * 0.97 / per_line))
            start = stop

    def _chunks(
        self, state: FileState, parsed: Parsed, end: int, damage: list[tfrecord.Damage], max_points: int
    ) -> Iterator[Chunk]:
        """Cut what one buffer held into chunks of about max_points points, each ending after a whole unit;
        damage before a chunk's end travels with that chunk (its position and its damage are spooled
        together), the rest with the last one."""
        damage = sorted(damage, key=lambda d: d.offset)
        cuts = list(parsed.cuts(max_points))
        for number, (unit_start, unit_stop, start, stop) in enumerate(cuts):
            last = number == len(cuts) - 1
            chunk_end = end if last else int(parsed.unit_ends[unit_stop - 1])
            mine = damage if last else [d for d in damage if d.offset < chunk_end]
            damage = [] if last else damage[len(mine) :]
            refused = parsed.refused_in(unit_start, unit_stop)
            if last and not (stop - start or refused or mine or chunk_end != state.offset):
                return
            yield self._chunk(state, chunk_end, parsed.series(start, stop), stop - start, refused, mine)
        if not cuts and (damage or end != state.offset):
            yield self._chunk(state, end, {}, 0, {}, damage)

    @staticmethod
    def _chunk(
        state: FileState,
        end: int,
        series: Series,
        count: int,
        refused: dict[tuple[str, str], int],
        damage: list[tfrecord.Damage],
    ) -> Chunk:
        if count:
            state.last_data_at = time.time()
        state.bad_records += len(damage) + sum(refused.values())
        chunk = Chunk(state, end, series, count, _fold_refused(refused), _fold_damage(damage))
        state.offset = end
        return chunk
