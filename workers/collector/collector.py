"""The collector's main loop: find and read the member's metric files, spool each batch with the file
positions it reaches, and let the shipper thread send what is durable.

Reading pauses while the spool is over its size limit (the source files are the buffer then); nothing is
dropped. On SIGTERM the collector reads once more, syncs, and keeps shipping for up to `drain_timeout`
seconds before it exits; whatever is left stays in the spool for the next start.
"""

from __future__ import annotations

import json
import logging
import socket
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from app.telemetry import wire
from workers.collector.fs_check import check_local
from workers.collector.shipper import Shipper
from workers.collector.sources import Chunk, FileState, OutputTracker
from workers.collector.spool import Spool

log = logging.getLogger(__name__)


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
        self.tracker = OutputTracker(config.output_dir, states)
        self.shipper = Shipper(self.spool, config.gateway_url, config.token, ca_bundle=config.ca_bundle)
        self.points_read = 0

    def _check_scope(self) -> None:
        path = self.config.spool_dir / "scope.json"
        scope = self.config.scope
        if path.exists():
            saved = json.loads(path.read_text() or "null")
            if scope and saved and saved != scope and self.spool.pending_count():
                raise CollectorError(
                    f"spool {self.config.spool_dir} holds unsent data of {saved}, not {scope}; "
                    "use another spool directory"
                )
            if scope is None:
                self.config.scope = saved
        if scope:
            path.write_text(json.dumps(scope))

    def _health(self) -> dict:
        damaged = {s.path: s.bad_records for s in self.tracker.states.values() if s.bad_records}
        lost = [s.path for s in self.tracker.states.values() if s.framing_lost]
        last = [s.last_data_at for s in self.tracker.states.values() if s.last_data_at]
        health: dict = {"files": len(self.tracker.states)}
        if damaged:
            health["damaged_records"] = damaged
        if lost:
            health["framing_lost"] = lost
        if last:
            health["last_data_at"] = max(last)
        if self.spool.stats.corrupt_records:
            health["spool_corrupt_records"] = self.spool.stats.corrupt_records
        return health

    def _spool_chunk(self, chunk: Chunk) -> None:
        source = chunk.state.source
        names = list(chunk.series)
        columns = [chunk.series[name] for name in names]
        steps = np.concatenate([np.array(c[0], dtype=np.int64) for c in columns])
        values = np.concatenate([np.array(c[1], dtype=np.float64) for c in columns])
        walls = np.concatenate([np.array(c[2], dtype=np.float64) for c in columns])
        seq = self.spool.last_seq + 1
        payload = wire.encode(
            self.collector_id,
            seq,
            [(source, name, len(c[0])) for name, c in zip(names, columns, strict=True)],
            steps,
            values,
            walls,
            scope=self.config.scope,
            health=self._health(),
        )
        state = {_state_key(chunk.state.identity.key): chunk.state.checkpoint()}
        appended = self.spool.append(payload, state)
        assert appended == seq, "only the collector loop appends to its spool"
        self.points_read += chunk.count

    def poll_once(self) -> int:
        """Read what is new in every file and spool it; returns the number of points read."""
        if self.spool.full:
            return 0
        before = self.points_read
        self.tracker.discover()
        for chunk in self.tracker.read(self.config.batch_points):
            if chunk.count:
                self._spool_chunk(chunk)
            if self.spool.full:
                break
        self.spool.sync()
        return self.points_read - before

    def run(self) -> None:
        self.shipper.start()
        try:
            while not self.stop_event.is_set():
                if self.poll_once() == 0:
                    self.spool.sync(force=True)
                    self.stop_event.wait(self.config.poll_interval)
            self.poll_once()
            self.spool.sync(force=True)
            deadline = time.monotonic() + self.config.drain_timeout
            while self.spool.pending_count() and time.monotonic() < deadline:
                time.sleep(0.05)
        finally:
            self.shipper.stop()
            self.shipper.join(timeout=60)
            self.tracker.close()
            self.spool.close()

    def stop(self) -> None:
        self.stop_event.set()
