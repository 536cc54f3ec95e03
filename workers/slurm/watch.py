"""Wake the Slurm worker the moment a job step writes a report (inotify on each attempt's `reports/`).

The steps write every report to a temporary name and rename it (ADR 0110), so one IN_MOVED_TO per report
is the whole signal; the worker then handles only the attempts whose directory moved (docs/slurm.md, ADR
0165). inotify sees what is written through this machine's kernel: on a local or a cluster filesystem
that forwards events it is immediate; on NFS a file written by another client raises no event, and the
worker's pass (every poll interval) is the path that still finds it. Where inotify is missing (not Linux,
the watch limit reached) `ReportWatch.available` is False and nothing else changes.

libc through ctypes: the standard library has no inotify binding and the worker needs three calls.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import os
import select
import struct
import threading
from collections.abc import Callable
from pathlib import Path

IN_CLOSE_WRITE = 0x00000008
IN_MOVED_TO = 0x00000080
IN_CREATE = 0x00000100
IN_IGNORED = 0x00008000
IN_NONBLOCK = 0o4000
IN_CLOEXEC = 0o2000000
_EVENT = struct.Struct("iIII")  # wd, mask, cookie, len (then len bytes of name)


def _libc():
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        libc.inotify_init1  # noqa: B018 - raises AttributeError where there is no inotify
        return libc
    except (OSError, AttributeError):
        return None


class ReportWatch:
    """Watches directories; calls `on_change(key)` (from its own thread) for each one whose files change.

    `add(path, key)` is idempotent per path; a removed directory drops its watch by itself (IN_IGNORED).
    """

    def __init__(self, on_change: Callable[[object], None]) -> None:
        self.on_change = on_change
        self.keys: dict[int, object] = {}  # watch descriptor → key
        self.paths: dict[str, int] = {}  # path → watch descriptor
        self.lock = threading.Lock()
        self.libc = _libc()
        self.fd = -1
        if self.libc is not None:
            fd = self.libc.inotify_init1(IN_NONBLOCK | IN_CLOEXEC)
            self.fd = fd if fd >= 0 else -1
        self.stop_r, self.stop_w = os.pipe()
        self.thread: threading.Thread | None = None

    @property
    def available(self) -> bool:
        return self.fd >= 0

    def add(self, path: Path, key: object) -> bool:
        """Watch `path` (a directory) for files renamed or written into it. False where it cannot be
        watched (no inotify, the directory is missing, the per-user watch limit): the pass still finds it."""
        if not self.available:
            return False
        name = str(path)
        with self.lock:
            if name in self.paths:
                return True
            wd = self.libc.inotify_add_watch(
                self.fd, os.fsencode(name), IN_MOVED_TO | IN_CLOSE_WRITE | IN_CREATE
            )
            if wd < 0:
                return False
            self.paths[name] = wd
            self.keys[wd] = key
        return True

    def remove(self, path: Path) -> None:
        if not self.available:
            return
        with self.lock:
            wd = self.paths.pop(str(path), None)
            if wd is not None:
                self.keys.pop(wd, None)
                self.libc.inotify_rm_watch(self.fd, wd)

    def start(self) -> None:
        if self.available and self.thread is None:
            self.thread = threading.Thread(target=self._loop, name="report-watch", daemon=True)
            self.thread.start()

    def close(self) -> None:
        os.write(self.stop_w, b"x")
        if self.thread is not None:
            self.thread.join(5)
        for fd in (self.fd, self.stop_r, self.stop_w):
            if fd >= 0:
                os.close(fd)
        self.fd = -1

    def _loop(self) -> None:
        while True:
            ready, _, _ = select.select([self.fd, self.stop_r], [], [])
            if self.stop_r in ready:
                return
            try:
                data = os.read(self.fd, 64 * 1024)
            except OSError as exc:
                if exc.errno in (errno.EAGAIN, errno.EINTR):
                    continue
                return
            changed = []
            offset = 0
            while offset + _EVENT.size <= len(data):
                wd, mask, _cookie, length = _EVENT.unpack_from(data, offset)
                offset += _EVENT.size + length
                with self.lock:
                    key = self.keys.get(wd)
                    if mask & IN_IGNORED:  # the directory went away: its watch is gone
                        self.keys.pop(wd, None)
                        for name, known in list(self.paths.items()):
                            if known == wd:
                                self.paths.pop(name)
                if key is not None and not mask & IN_IGNORED and key not in changed:
                    changed.append(key)
            for key in changed:
                self.on_change(key)
