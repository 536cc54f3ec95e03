"""TFRecord framing (the container of TensorBoard event files), read without TensorFlow.

Each record: u64 little-endian length, u32 masked CRC32C of those 8 bytes, the data, u32 masked CRC32C of
the data. A record cut short at the end of the file is normal while the writer runs: reading stops before
it and the caller resumes from the same offset later (at the member's end, `final`, it is damage).

Damage loses only what is damaged. A bad data CRC skips that one record (its length is trustworthy). A bad
length CRC means the framing is lost at that byte, so the reader resynchronises: it scans forward for the
next offset whose length CRC verifies and whose record's data CRC verifies, and goes on from there. Every
skipped region is returned as a `Damage` (offset, bytes, reason) so that it can be recorded and shown.
"""

from __future__ import annotations

import functools
import struct
from dataclasses import dataclass, field

import google_crc32c
import numpy as np

_HEADER = struct.Struct("<QI")
_LENGTH = struct.Struct("<Q")
_FOOTER = struct.Struct("<I")
HEADER_SIZE = _HEADER.size  # 12
FOOTER_SIZE = _FOOTER.size  # 4
_MASK_DELTA = 0xA282EAD8
# A record longer than this is treated as corrupt framing rather than allocated.
MAX_RECORD_BYTES = 256 * 1024 * 1024


def masked_crc32c(data: bytes | memoryview) -> int:
    crc = google_crc32c.value(bytes(data))
    return (((crc >> 15) | (crc << 17)) + _MASK_DELTA) & 0xFFFFFFFF


def frame(data: bytes) -> bytes:
    """One record in TFRecord framing (used by tests to build files byte by byte)."""
    length = struct.pack("<Q", len(data))
    return length + struct.pack("<I", masked_crc32c(length)) + data + struct.pack("<I", masked_crc32c(data))


BAD_DATA_CRC = "record data fails its CRC"
BAD_LENGTH = "record length fails its CRC; skipped to the next intact record"
CUT_SHORT = "record cut short at the end of the file"


@dataclass(frozen=True)
class Damage:
    offset: int  # in the file
    length: int  # bytes skipped
    reason: str


@dataclass
class ScanResult:
    """What one pass over a buffer found: the intact records as positions in `data` (`starts`, `lengths`:
    where each record's payload begins and how long it is), the damage skipped, and how far it got."""

    data: bytes = b""
    base_offset: int = 0
    starts: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    lengths: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    consumed: int = 0  # bytes of the buffer fully handled (complete records and skipped damage)
    damage: list[Damage] = field(default_factory=list)

    @property
    def ends(self) -> np.ndarray:
        """File offset just past each intact record (its footer included)."""
        return self.base_offset + self.starts + self.lengths + FOOTER_SIZE

    @property
    def records(self) -> list[tuple[int, bytes]]:
        """(file offset just past the record, payload) for each intact record."""
        return [
            (end, self.data[start : start + length])
            for end, start, length in zip(
                self.ends.tolist(), self.starts.tolist(), self.lengths.tolist(), strict=True
            )
        ]


def _header_at(view: memoryview, pos: int) -> int | None:
    """The record length at `pos` if its length CRC verifies (and it is not absurd), else None."""
    length, length_crc = _HEADER.unpack_from(view, pos)
    if length > MAX_RECORD_BYTES or masked_crc32c(view[pos : pos + 8]) != length_crc:
        return None
    return length


def record_size_at(buffer: bytes | memoryview) -> int | None:
    """The whole size (header, payload, footer) of the record the buffer starts with, if its header
    verifies; None when the buffer is shorter than a header or the header is damaged."""
    if len(buffer) < HEADER_SIZE:
        return None
    length = _header_at(memoryview(buffer), 0)
    return None if length is None else HEADER_SIZE + length + FOOTER_SIZE


def _resync(view: memoryview, start: int) -> int | None:
    """The first offset at or after `start` where an intact record starts, or where a record whose header
    verifies runs past the buffer (it may be completed later); None if there is none in the buffer."""
    end = len(view)
    for pos in range(start, end - HEADER_SIZE + 1):
        length = _header_at(view, pos)
        if length is None:
            continue
        total = HEADER_SIZE + length + FOOTER_SIZE
        if end - pos < total:
            return pos
        (data_crc,) = _FOOTER.unpack_from(view, pos + HEADER_SIZE + length)
        if masked_crc32c(view[pos + HEADER_SIZE : pos + HEADER_SIZE + length]) == data_crc:
            return pos
    return None


def _walk(data: bytes, pos: int) -> tuple[np.ndarray, np.ndarray]:
    """Record starts and lengths from `pos`, trusting each length (checked afterwards, all at once) as long
    as the record fits in the buffer and is not absurd.

    A writer logging the same tags every step writes records whose lengths repeat with a short period
    (one record per tag). Once the lengths walked so far repeat, the next ones are predicted in bulk and
    all checked against the lengths actually stored there, so such a file is walked a few numpy passes
    at a time; an attempt that fails waits longer before the next one."""
    starts: list[int] = []
    lengths: list[int] = []
    bulk: list[tuple[np.ndarray, np.ndarray]] = []
    end = len(data)
    unpack = _LENGTH.unpack_from
    next_try, wait, size = 64, 64, 1024
    while end - pos >= HEADER_SIZE:
        (length,) = unpack(data, pos)
        if length > MAX_RECORD_BYTES or end - pos < HEADER_SIZE + length + FOOTER_SIZE:
            break
        starts.append(pos)
        lengths.append(length)
        pos += HEADER_SIZE + length + FOOTER_SIZE
        if len(starts) < next_try:
            continue
        found = _predict(data, pos, lengths[-32:], size)
        if found is None or len(found[0]) < size:
            wait, size = min(wait * 2, 65536), 1024
        else:
            wait, size = 64, min(size * 2, 65536)
        if found is not None and len(found[0]):
            bulk.append((np.asarray(starts, dtype=np.int64), np.asarray(lengths, dtype=np.int64)))
            bulk.append(found)
            pos = int(found[0][-1] + found[1][-1]) + HEADER_SIZE + FOOTER_SIZE
            starts, lengths = [], []
        next_try = len(starts) + wait
    bulk.append((np.asarray(starts, dtype=np.int64), np.asarray(lengths, dtype=np.int64)))
    return np.concatenate([b[0] for b in bulk]), np.concatenate([b[1] for b in bulk])


def _predict(data: bytes, pos: int, recent: list[int], size: int) -> tuple[np.ndarray, np.ndarray] | None:
    """Up to `size` records from `pos` whose lengths continue the period of `recent` (None when recent
    lengths do not repeat): the prefix of the prediction that the stored lengths confirm."""
    period = next((p for p in range(1, 17) if recent[p:] == recent[:-p]), None)
    if period is None or len(recent) < 2 * period:
        return None
    cycle = np.asarray(recent[-period:], dtype=np.int64)
    total = HEADER_SIZE + FOOTER_SIZE
    fits = (len(data) - pos) // int((cycle + total).sum()) * period
    count = min(size, fits)
    if count <= 0:
        return None
    expected = np.tile(cycle, count // period + 1)[:count]
    offsets = pos + np.concatenate(([0], np.cumsum(expected[:-1] + total)))
    stored = values_at(np.frombuffer(data, dtype=np.uint8), offsets, "<u8")
    agree = stored == expected.astype(np.uint64)
    good = count if agree.all() else int(np.argmin(agree))
    return offsets[:good], expected[:good]


def scan(
    buffer: bytes | memoryview, base_offset: int = 0, final: bool = False, more_to_read: bool = False
) -> ScanResult:
    """Split `buffer` (file bytes starting at `base_offset`) into complete records. With `final` (the
    writer is gone and the buffer reaches the end of the file) a cut-short tail is damage too.

    A damaged region with no intact record after it yet is left for the next read (the writer may still
    be writing what follows), so that one region is reported once, whole; it is reported up to where the
    buffer ends only when the file holds more than the buffer (`more_to_read`) or at the end (`final`).

    The common case is checked in bulk: a run of records is found by trusting each length, then every
    length CRC and data CRC of the run is computed at once (masked_crc32c_many); the first length that
    fails its CRC ends the run and the record-by-record path takes over there (resynchronisation)."""
    data = bytes(buffer)
    view = memoryview(data)
    result = ScanResult(data=data)
    starts: list[np.ndarray] = []
    lengths: list[np.ndarray] = []
    pos = 0
    end = len(data)
    while end - pos >= HEADER_SIZE:
        run_starts, run_lengths = _walk(data, pos)
        if len(run_starts):
            at, length = run_starts, run_lengths
            # A length CRC depends on the length alone: one CRC per distinct length.
            distinct, which = np.unique(length, return_inverse=True)
            expected = np.array([masked_crc32c(struct.pack("<Q", n)) for n in distinct.tolist()], np.uint64)
            header_ok = expected[which.ravel()] == _u32_at(data, at + 8)
            good = len(at) if header_ok.all() else int(np.argmin(header_ok))
            at, length = at[:good], length[:good]
            data_ok = masked_crc32c_many(data, at + HEADER_SIZE, length) == _u32_at(
                data, at + HEADER_SIZE + length
            )
            for bad in np.flatnonzero(~data_ok).tolist():
                total = HEADER_SIZE + int(length[bad]) + FOOTER_SIZE
                result.damage.append(Damage(base_offset + int(at[bad]), total, BAD_DATA_CRC))
            starts.append(at[data_ok] + HEADER_SIZE)
            lengths.append(length[data_ok])
            if good == len(run_starts):
                pos = int(run_starts[-1] + run_lengths[-1]) + HEADER_SIZE + FOOTER_SIZE
                continue
            pos = int(run_starts[good])
        # One step record by record: a length that fails its CRC (resynchronise), or a last record that
        # does not fit in the buffer (wait for the writer).
        if end - pos < HEADER_SIZE:
            break
        length_at = _header_at(view, pos)
        if length_at is not None:
            break  # it verifies but does not fit: the writer is mid-record (a fitting one ran above)
        resume = _resync(view, pos + 1)
        if resume is None:
            if final:
                resume = end
            elif more_to_read:
                resume = end - HEADER_SIZE + 1  # no offset before this can start a record
            else:
                break
        result.damage.append(Damage(base_offset + pos, resume - pos, BAD_LENGTH))
        pos = resume
    if final and pos < end:
        result.damage.append(Damage(base_offset + pos, end - pos, CUT_SHORT))
        pos = end
    result.consumed = pos
    result.base_offset = base_offset
    result.starts = np.concatenate(starts) if starts else np.zeros(0, dtype=np.int64)
    result.lengths = np.concatenate(lengths) if lengths else np.zeros(0, dtype=np.int64)
    return result


def values_at(raw: np.ndarray, offsets: np.ndarray, dtype: str) -> np.ndarray:
    """The little-endian number of `dtype` (e.g. "<u4") stored at each offset of the byte array `raw`."""
    width = np.dtype(dtype).itemsize
    return raw[offsets[:, None] + np.arange(width)].copy().view(dtype).ravel()


def _u32_at(data: bytes, offsets: np.ndarray) -> np.ndarray:
    return values_at(np.frombuffer(data, dtype=np.uint8), offsets, "<u4").astype(np.uint64)


def _crc_table() -> np.ndarray:
    table = np.arange(256, dtype=np.uint64)
    for _ in range(8):
        table = np.where(table & 1, (table >> np.uint64(1)) ^ np.uint64(0x82F63B78), table >> np.uint64(1))
    return table.astype(np.uint32)


_TABLE = _crc_table()
# Below this many records of one length, one call per record costs less than setting up the bulk pass;
# above this length the bulk pass's matrix of bytes grows too large for what it saves.
_BULK_MIN_RECORDS = 32
_BULK_MAX_LENGTH = 512


@functools.lru_cache(maxsize=64)
def _position_tables(length: int) -> tuple[np.ndarray, int]:
    """CRC-32C is linear: the CRC of `length` bytes is the CRC of as many zero bytes XOR, for each
    position j, a table lookup of the byte there (its effect on the register after the bytes that follow
    it). Returns the tables flattened (position j at j*256) and the zero bytes' CRC."""
    tables = np.empty((length, 256), dtype=np.uint32)
    column = _TABLE.copy()
    for position in range(length - 1, -1, -1):
        tables[position] = column
        column = _TABLE[column & 0xFF] ^ (column >> 8)  # one more zero byte after it
    return tables.ravel(), google_crc32c.value(bytes(length))


def masked_crc32c_many(data: bytes, offsets: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """masked_crc32c of data[offsets[i] : offsets[i] + lengths[i]] for every i, as uint64. Records of one
    length are computed together (one table lookup per byte, all records at once), so a file of small
    scalar events costs a few numpy passes instead of a call per record."""
    out = np.zeros(len(offsets), dtype=np.uint64)
    if not len(offsets):
        return out
    raw = np.frombuffer(data, dtype=np.uint8)
    for length in np.unique(lengths).tolist():
        which = np.flatnonzero(lengths == length)
        if len(which) < _BULK_MIN_RECORDS or length > _BULK_MAX_LENGTH or length == 0:
            for i in which.tolist():
                start = int(offsets[i])
                out[i] = masked_crc32c(data[start : start + length])
            continue
        tables, zeros = _position_tables(length)
        index = raw[offsets[which][:, None] + np.arange(length)].astype(np.intp)
        index += np.arange(0, 256 * length, 256)
        crc = (np.bitwise_xor.reduce(tables[index], axis=1) ^ np.uint32(zeros)).astype(np.uint64)
        out[which] = (((crc >> 15) | (crc << 17)) + _MASK_DELTA) & 0xFFFFFFFF
    return out
