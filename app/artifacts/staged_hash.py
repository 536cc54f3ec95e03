"""The sha256 of a staged file computed while its chunks arrive in order, so assembly need not read the
file again (docs/artifacts.md, object delivery).

One `StagedHash` per staged file lives in the receiving process (the registry below): `hashed` bytes from
the start of the file are proven by `sha`, computed over exactly the bytes this process received and
wrote. A chunk that starts at `hashed` extends the proof once it is recorded; any other chunk is written
without hashing and is checked when the file is assembled (which continues the hash from `hashed` by
reading the rest of the staged file, checking each chunk's recorded digest, as it does for a whole file).

The proof is only as good as "the staged bytes are still the bytes this process wrote". Every write to the
staged file goes through `StagedWriter.write`, which records the file's identity (inode, size, mtime,
ctime) right after it; assembly trusts the proof only if the file's identity is unchanged, no other write
of this process is still running, and the proven prefix was never rewritten. A write by anyone else — the
disk tool or person that damaged it, another server process handling a resumed upload — changes mtime and
ctime, and the file is then read again in full. (On kernels with fine-grained ("multigrain") timestamps,
Linux 6.13+, any later write shows; on older kernels a write in the same clock tick as this process's own
last write may not.) A restarted process has no state and reads the whole file, as before.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import sys
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# States of abandoned uploads are forgotten oldest first beyond this many (forgetting one only costs a
# full read of that file at assembly).
MAX_STATES = 4096
# How often (bytes written by one chunk upload) the kernel is asked to start writing them to disk.
WRITEBACK_STEP = 8 * 1024 * 1024


def file_identity(fd: int) -> tuple[int, int, int, int]:
    st = os.fstat(fd)
    return (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


@dataclass
class StagedHash:
    sha: Any = field(default_factory=hashlib.sha256)
    hashed: int = 0
    identity: tuple[int, int, int, int] | None = None
    writers: int = 0
    broken: bool = False
    lock: threading.Lock = field(default_factory=threading.Lock)


class StagedHashes:
    """The process's StagedHash per staged file path."""

    def __init__(self, limit: int = MAX_STATES) -> None:
        self._states: OrderedDict[str, StagedHash] = OrderedDict()
        self._lock = threading.Lock()
        self._limit = limit

    def writer(self, staged: Path, fd: int, offset: int) -> StagedWriter:
        """A writer for one chunk at `offset` of the staged file open as `fd` (opened by the caller)."""
        key = str(staged)
        with self._lock:
            state = self._states.get(key)
            if state is not None:
                with state.lock:
                    # Someone else (another process, a person) wrote the file since this process's last write.
                    if state.identity is not None and file_identity(fd) != state.identity:
                        state.broken = True
                    if state.broken and state.writers == 0 and offset == 0:
                        state = None  # nothing left to trust: a fresh proof starts with this first chunk
            if state is None:
                if offset != 0:
                    return StagedWriter(None, offset, False)
                state = StagedHash()
                self._states[key] = state
                while len(self._states) > self._limit:
                    self._states.popitem(last=False)
            self._states.move_to_end(key)
            with state.lock:
                state.writers += 1
                if offset < state.hashed:
                    state.broken = True  # the proven prefix is being rewritten
                return StagedWriter(state, offset, not state.broken and offset == state.hashed)

    def take(self, staged: Path) -> StagedHash | None:
        """Remove and return the state of a file being assembled (or discarded)."""
        with self._lock:
            return self._states.pop(str(staged), None)

    def forget_under(self, root: Path) -> None:
        prefix = str(root).rstrip(os.sep) + os.sep
        with self._lock:
            for key in [k for k in self._states if k.startswith(prefix)]:
                del self._states[key]


class StagedWriter:
    """Writes one chunk's blocks in place; hashes them too when the chunk extends the proven prefix."""

    def __init__(self, state: StagedHash | None, offset: int, in_order: bool) -> None:
        self.state = state
        self.offset = offset
        self.sha = state.sha.copy() if (state is not None and in_order) else None
        self.written = 0
        self.flushed = 0
        self.closed = False

    def write(self, fd: int, block: Any) -> None:
        if self.sha is not None:
            self.sha.update(block)  # outside the lock: the costly part runs in parallel with other files
        position = self.offset + self.written
        if self.state is None:
            _pwrite_all(fd, block, position)
        else:
            with self.state.lock:
                _pwrite_all(fd, block, position)
                self.state.identity = file_identity(fd)
        self.written += len(block)
        if self.written - self.flushed >= WRITEBACK_STEP:
            start_writeback(fd, self.offset + self.flushed, self.written - self.flushed)
            self.flushed = self.written

    def close(self) -> None:
        """The body is done (received whole or not): this writer no longer writes."""
        if self.state is not None and not self.closed:
            with self.state.lock:
                self.state.writers -= 1
        self.closed = True

    def commit(self) -> None:
        """The chunk is recorded: its bytes extend the proof if it still starts where the proof ends."""
        self.close()
        state = self.state
        if state is None or self.sha is None:
            return
        with state.lock:
            if not state.broken and state.hashed == self.offset:
                state.sha = self.sha
                state.hashed = self.offset + self.written


def trusted_prefix(state: StagedHash | None, fd: int) -> tuple[Any, int]:
    """(sha256 over the proven prefix, its length) of a staged file being assembled: (fresh, 0) when the
    state is missing or cannot be trusted (see the module docstring)."""
    if state is None:
        return hashlib.sha256(), 0
    with state.lock:
        if state.broken or state.writers or state.identity != file_identity(fd):
            return hashlib.sha256(), 0
        return state.sha, state.hashed


def _writeback_call() -> Any:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        call = libc.sync_file_range
    except (OSError, AttributeError):
        return None
    call.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
    return call


_SYNC_FILE_RANGE = _writeback_call() if sys.platform.startswith("linux") else None
SYNC_FILE_RANGE_WRITE = 2


def start_writeback(fd: int, offset: int, length: int) -> None:
    """Ask the kernel to start writing this range to disk now, without waiting (Linux sync_file_range
    SYNC_FILE_RANGE_WRITE; nothing elsewhere). The disk then works while the rest of the file arrives and
    the fsync at assembly finds most of it written. Durability still comes from that fsync alone."""
    if _SYNC_FILE_RANGE is not None:
        _SYNC_FILE_RANGE(fd, offset, length, SYNC_FILE_RANGE_WRITE)


def _pwrite_all(fd: int, data: Any, offset: int) -> None:
    # No fsync per chunk: a recorded chunk that a crash lost is caught when the file is assembled (the
    # process that crashed lost its proof, so the whole file is read and each chunk checked against its
    # digest) and sent again; the assembled file is fsynced once.
    view = memoryview(data)
    while view:
        written = os.pwrite(fd, view, offset)
        view, offset = view[written:], offset + written


# The receiving process's registry: the Flask server builds a receiver per request, the node gateway one.
STAGED_HASHES = StagedHashes()
