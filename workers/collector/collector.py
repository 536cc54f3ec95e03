"""The collector's main loop: find and read the member's metric files, spool each batch with the file
positions it reaches, and let the shipper thread send what is durable.

Reading pauses while the spool is over its size limit (the source files are the buffer then); nothing is
dropped. On SIGTERM, or when the agent has written the `member-exited` marker into the spool directory,
the collector drains: it reads every file to its end (with the marker, a cut-short tail counts as damage
and a last line without its newline is read), syncs, and keeps shipping for up to `drain_timeout`
seconds. With the marker and everything acknowledged it sends one last, empty batch marked `final`, which
makes the member's metrics `complete` (or `incomplete` with the reason, when batches were refused).
Whatever could not be sent stays in the spool for the next start, and the exit status says so.
"""

from __future__ import annotations

import json
import logging
import os
import resource
import socket
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tuneplane.app.telemetry import wire
from tuneplane.workers.collector.fs_check import check_local
from tuneplane.workers.collector.markers import FINAL_SENT, MEMBER_EXITED
from tuneplane.workers.collector.shipper import Shipper
from tuneplane.workers.collector.sources import Chunk, FileState, OutputTracker
from tuneplane.workers.collector.spool import Spool
from tuneplane.workers.collector.system import SOURCE as SYSTEM_SOURCE
from tuneplane.workers.collector.system import SystemSampler, load_nvml
from tuneplane.workers.proctree import tagged

log = logging.getLogger(__name__)

EXIT_UNDRAINED = 3  # batches are left in the spool (the gateway could not be reached in time)
WRITE_RETRY = 1.0  # seconds between tries to write a batch the spool's disk refused (full)


class CollectorError(Exception):
    pass


@dataclass
class CollectorConfig:
    output_dir: Path
    spool_dir: Path
    gateway_url: str
    token: str
    collector_id: str | None = None
    scope: dict | None = None
    poll_interval: float = 0.5
    batch_points: int = 65536
    fsync_interval: float = 1.0
    segment_bytes: int = 16 * 1024 * 1024
    spool_max_bytes: int = 2 * 1024 * 1024 * 1024
    drain_timeout: float = 30.0
    ca_bundle: str | None = None
    # Host and GPU samples of the member (workers.collector.system); 0 turns them off.
    sample_interval: float = 10.0
    member_tag: str | None = None
    gpu_indices: tuple[int, ...] = ()
    # With a member tag: once the process that started the collector (the agent) is gone and no process of
    # the member has run for this long, the member has ended with nobody left to say so: drain and stop.
    orphan_grace: float = 30.0


def open_files_budget(ceiling: int = 65536) -> int:
    """How many metric files the collector may hold open. The soft limit on descriptors (often 1024) is
    first raised to the hard one (at most `ceiling`): one SummaryWriter per hyper-parameter trial leaves
    hundreds or thousands of event files. A quarter (at least 64) stays for the spool, the senders'
    connections and listing directories; files beyond the budget are closed while idle and opened again
    when they grow (workers.collector.sources.OutputTracker)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = ceiling if hard == resource.RLIM_INFINITY else min(hard, ceiling)
    if soft != resource.RLIM_INFINITY and soft < wanted:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
            soft = wanted
        except (ValueError, OSError) as exc:
            log.warning("cannot raise the open-files limit from %d to %d: %s", soft, wanted, exc)
    if soft == resource.RLIM_INFINITY:
        soft = ceiling
    return max(8, min(soft - 64, soft * 3 // 4))


def _saved_scope(path: Path) -> dict | None:
    """The scope the spool was last used for; an unreadable file (cut short by a crash of the version that
    wrote it in place: every start then died on it) counts as none and is written again."""
    try:
        saved = json.loads(path.read_text() or "null")
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        log.warning("spool scope file %s is unreadable (%s); writing it again", path, exc)
        return None
    return saved if isinstance(saved, dict) else None


def sample_delay(taken: int, interval: float) -> float:
    """Seconds until the next host/GPU sample after `taken` samples: 1, 2, 4, 8 … up to the interval, so a
    member that runs 10 seconds still gets several samples (at 0, 1, 3 and 7 s with the default 10 s)
    and its CPU (which needs two) is measured; then every interval."""
    return min(interval, float(2 ** min(taken, 16)))


def _state_key(key: tuple[int, int]) -> str:
    return f"{key[0]}:{key[1]}"


class Collector:
    def __init__(self, config: CollectorConfig) -> None:
        self.config = config
        self.stop_event = threading.Event()
        check_local(config.spool_dir)
        self.spool = Spool(
            config.spool_dir,
            segment_bytes=config.segment_bytes,
            fsync_interval=config.fsync_interval,
            max_bytes=config.spool_max_bytes,
        ).open()
        self._check_scope()
        base = config.collector_id or socket.gethostname()
        # The spool's own id is part of the batch id: a wiped spool restarts its sequence numbers, and
        # must not have its new batches mistaken for the old ones.
        self.collector_id = f"{base}/{self.spool.collector_uuid[:16]}"
        states = {}
        for key, data in self.spool.file_states.items():
            dev, ino = key.split(":")
            states[(int(dev), int(ino))] = FileState.from_checkpoint(data)
        self.tracker = OutputTracker(config.output_dir, states, max_open=open_files_budget())
        self.shipper = Shipper(self.spool, config.gateway_url, config.token, ca_bundle=config.ca_bundle)
        self.points_read = 0
        self.records_spooled = 0
        self.sampler: SystemSampler | None = None
        if config.sample_interval > 0 and (config.member_tag or config.gpu_indices):
            nvml = load_nvml() if config.gpu_indices else None
            self.sampler = SystemSampler(config.member_tag, list(config.gpu_indices), nvml)
        self._next_sample = 0.0
        self._samples_taken = 0
        self._parent = os.getppid()
        self._member_seen = time.monotonic()
        self._next_member_check = 0.0
        self._write_blocked_until = 0.0
        self._health_memo: dict | None = None
        self._write_error: str | None = None
        self._write_error_said = 0.0

    def _check_scope(self) -> None:
        path = self.config.spool_dir / "scope.json"
        scope = self.config.scope
        saved = _saved_scope(path)
        if scope and saved and saved != scope and self.spool.pending_count():
            raise CollectorError(
                f"spool {self.config.spool_dir} holds unsent data of {saved}, not {scope}; "
                "use another spool directory"
            )
        if scope is None:
            self.config.scope = saved
        elif saved != scope:
            try:  # atomically: a half-written file must not stop every later start
                tmp = path.with_suffix(".tmp")
                tmp.write_text(json.dumps(scope))
                os.replace(tmp, path)
            except OSError as exc:  # a full disk must not keep the collector from sending what is spooled
                log.warning("cannot record the spool's scope in %s: %s", path, exc.strerror)

    def _health(self, state: FileState | None = None) -> dict:
        """The collector's summary sent with a batch. Summed over every file once per poll, not once per
        batch (one batch per file with news: a poll of 5,000 trial files took 3.4 s, 2.7 s of it here), with
        the batch's own file brought up to date."""
        if self._health_memo is None:
            damaged = {s.path: s.bad_records for s in self.tracker.states.values() if s.bad_records}
            last = [s.last_data_at for s in self.tracker.states.values() if s.last_data_at]
            self._health_memo = {"files": len(self.tracker.states)}
            if damaged:
                self._health_memo["refused_or_damaged"] = damaged
            if last:
                self._health_memo["last_data_at"] = max(last)
        health = dict(self._health_memo)
        if state is not None and state.bad_records:
            damaged = {**health.get("refused_or_damaged", {}), state.path: state.bad_records}
            health["refused_or_damaged"] = damaged
        if state is not None and state.last_data_at:
            health["last_data_at"] = max(health.get("last_data_at", 0.0), state.last_data_at)
        if self.spool.stats.corrupt_records:
            health["spool_corrupt_records"] = self.spool.stats.corrupt_records
        return health

    def _spool_chunk(self, chunk: Chunk) -> bool:
        source = chunk.state.source
        names = list(chunk.series)
        columns = [chunk.series[name] for name in names]
        steps = np.concatenate([c[0] for c in columns]) if columns else np.zeros(0, dtype=np.int64)
        values = np.concatenate([c[1] for c in columns]) if columns else np.zeros(0)
        walls = np.concatenate([c[2] for c in columns]) if columns else np.zeros(0)
        seq = self.spool.last_seq + 1
        payload = wire.encode(
            self.collector_id,
            seq,
            [(source, name, len(c[0])) for name, c in zip(names, columns, strict=True)],
            steps,
            values,
            walls,
            scope=self.config.scope,
            health=self._health(chunk.state),
            refused=[(source, name, reason, n) for (name, reason), n in sorted(chunk.refused.items())],
            damage=[(source, chunk.state.path, d.offset, d.length, d.reason) for d in chunk.damage],
        )
        key = _state_key(chunk.state.identity.key)
        try:
            appended = self.spool.append(payload, {key: chunk.state.checkpoint()})
        except OSError as exc:
            # The spool's disk is full (or failing): this file goes back to where its last spooled batch
            # left it, so the same bytes are read again once the spool can be written; nothing is lost.
            saved = self.spool.file_states.get(key)
            back = FileState.from_checkpoint(saved) if saved else None
            chunk.state.offset = back.offset if back else 0
            chunk.state.bad_records = back.bad_records if back else 0
            self._spool_write_failed(exc)
            return False
        assert appended == seq, "only the collector loop appends to its spool"
        self.points_read += chunk.count
        self.records_spooled += 1
        return True

    def _spool_write_failed(self, exc: OSError) -> None:
        """Reading pauses and the write is tried again after WRITE_RETRY seconds; sending goes on (acks free
        room). Said once a minute at most."""
        now = time.monotonic()
        self._write_blocked_until = now + WRITE_RETRY
        if self._write_error != exc.strerror or now - self._write_error_said > 60:
            self._write_error, self._write_error_said = exc.strerror, now
            log.warning(
                "spool: cannot write (%s); reading paused, tried again every %gs; nothing is lost "
                "(the files are read again from the last spooled position)",
                exc.strerror,
                WRITE_RETRY,
            )

    @property
    def spool_blocked(self) -> bool:
        """No room for new batches now: the spool is over its size limit or its disk refused a write."""
        return self.spool.full or time.monotonic() < self._write_blocked_until

    def poll_once(self, final: bool = False) -> int:
        """Read what is new in every file and spool it; returns the number of spool records written
        (points, refusals or damage)."""
        if self.spool_blocked:
            return 0
        before = self.records_spooled
        self._health_memo = None
        self.tracker.discover()
        for chunk in self.tracker.read(self.config.batch_points, final=final):
            if chunk.news:
                if not self._spool_chunk(chunk):
                    break
                # Per batch, not per poll: a sender with nothing durable gets this batch at once (fsync
                # when starving, else at the interval) while the rest of a large file is still being read.
                self.spool.sync()
            if self.spool.full:
                break
        self.spool.sync()
        return self.records_spooled - before

    def sample_system(self) -> None:
        """One host/GPU sample of the member as one batch (source `system`, step = milliseconds since the
        epoch), when the sampling interval has passed."""
        if self.sampler is None or time.monotonic() < self._next_sample or self.spool_blocked:
            return
        self._next_sample = time.monotonic() + sample_delay(self._samples_taken, self.config.sample_interval)
        self._samples_taken += 1
        values = self.sampler.sample()
        if not values:
            return
        now = time.time()
        names = sorted(values)
        payload = wire.encode(
            self.collector_id,
            self.spool.last_seq + 1,
            [(SYSTEM_SOURCE, name, 1) for name in names],
            [int(now * 1000)] * len(names),
            [values[name] for name in names],
            [now] * len(names),
            scope=self.config.scope,
        )
        try:
            self.spool.append(payload, {})
        except OSError as exc:
            self._spool_write_failed(exc)  # this sample is skipped; the next one comes at its interval
            return
        self.records_spooled += 1

    @property
    def member_exited(self) -> bool:
        return (self.config.spool_dir / MEMBER_EXITED).exists()

    def orphaned_after_member(self) -> bool:
        """True once the agent that started this collector is gone (its parent changed) and no process of
        the member has been seen for orphan_grace seconds: the member ended and no agent is left to write
        the member-exited marker, so the collector writes it itself and drains. While the agent lives this
        never fires (the agent decides); while the member still runs, the collector keeps collecting."""
        if not self.config.member_tag or os.getppid() == self._parent:
            return False
        now = time.monotonic()
        if now < self._next_member_check:
            return False
        self._next_member_check = now + min(2.0, self.config.orphan_grace / 4)
        if tagged(self.config.member_tag):
            self._member_seen = now
            return False
        if now - self._member_seen < self.config.orphan_grace:
            return False
        log.warning(
            "the agent that started this collector is gone and no process of the member has run for %.0fs: "
            "draining as if the member exited",
            now - self._member_seen,
        )
        (self.config.spool_dir / MEMBER_EXITED).write_text(f"{time.time()}\n")
        return True

    def drain_files(self, final: bool, deadline: float) -> None:
        """Read every file to its end (what a single read leaves, the next one takes), waiting for the
        shipper while the spool is full. Stops as soon as a poll changes nothing: what is left then cannot be
        read now (a torn last line or record while its writer lives, a file that cannot be read); before,
        such a file kept this loop spinning on a core until the drain deadline (30 s by default)."""
        while time.monotonic() < deadline:
            mark = self._reading_mark()
            wrote = self.poll_once(final=final)
            if self.spool_blocked:
                self.spool.sync(force=True)
                time.sleep(0.05)
                continue
            if not self.tracker.unread():
                return
            if wrote == 0 and self._reading_mark() == mark:
                log.info("drain: what is left in the files cannot be read now; it is read at the next start")
                return
        log.warning("drain: files still unread at the deadline")

    def _reading_mark(self) -> tuple[int, ...]:
        """Changes whenever a poll made progress: a batch spooled, a position moved, a read window grown (a
        line longer than the window is read whole next time), a file opened."""
        tracker = self.tracker
        return (
            self.records_spooled,
            sum(state.offset for state in tracker.states.values()),
            sum(tracker.read_sizes.values()),
            len(tracker.handles),
            len(tracker.waiting),
        )

    def _wait_shipped(self, deadline: float) -> bool:
        """Every batch acknowledged, woken by the last ack (a member's end waits on this twice: before and
        after its final batch; a 20 ms poll added 10 ms to each on average)."""
        self.spool.sync(force=True)
        return self.spool.wait_all_acked(deadline - time.monotonic())

    def _send_final(self, deadline: float) -> None:
        """All batches are acknowledged: one empty batch marked final ends the member's metrics."""
        rejected = len(list((self.config.spool_dir / "rejected").glob("*.batch")))
        self._health_memo = None
        health = self._health()
        if rejected:
            health["rejected_batches"] = rejected
        # A file that still could not be read at the member's end (no permission, an I/O error) lost what
        # it holds: shown as a damaged region with the reason, not only in the collector's log.
        unreadable = [
            (source, path, offset, length, f"file could not be read: {reason}")
            for path, (source, offset, length, reason) in sorted(self.tracker.unreadable.items())
        ]
        payload = wire.encode(
            self.collector_id,
            self.spool.last_seq + 1,
            [],
            [],
            [],
            [],
            scope=self.config.scope,
            health=health,
            damage=unreadable,
            final=True,
        )
        try:
            self.spool.append(payload, {})
        except OSError as exc:
            self._spool_write_failed(exc)  # not sent: the next start (the agent's) drains again
            return
        if self._wait_shipped(deadline):
            (self.config.spool_dir / FINAL_SENT).write_text(f"{self.spool.last_seq}\n")

    def run(self) -> int:
        """The collector's life; returns its exit status (0, or EXIT_UNDRAINED with batches left)."""
        self.shipper.start()
        try:
            while not self.stop_event.is_set() and not self.member_exited:
                if self.orphaned_after_member():
                    break
                self.sample_system()
                if self.poll_once() == 0:
                    self.spool.sync(force=True)
                    self.stop_event.wait(self.config.poll_interval)
            final = self.member_exited
            deadline = time.monotonic() + self.config.drain_timeout
            self.drain_files(final, deadline)
            shipped = self._wait_shipped(deadline)
            if shipped and final and not (self.config.spool_dir / FINAL_SENT).exists():
                self._send_final(deadline)
                shipped = (self.config.spool_dir / FINAL_SENT).exists()
            return 0 if shipped else EXIT_UNDRAINED
        finally:
            self.shipper.stop()
            self.shipper.join(timeout=60)
            self.tracker.close()
            self.spool.close()

    def stop(self) -> None:
        self.stop_event.set()
