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

import struct
from collections.abc import Iterator
from dataclasses import dataclass, field

import google_crc32c

_HEADER = struct.Struct("<QI")
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
    """What one pass over a buffer found."""

    records: list[tuple[int, bytes]] = field(default_factory=list)  # (offset just past the record, data)
    consumed: int = 0  # bytes of the buffer fully handled (complete records and skipped damage)
    damage: list[Damage] = field(default_factory=list)

    @property
    def bad_data_crc(self) -> int:
        return sum(1 for d in self.damage if d.reason == BAD_DATA_CRC)


def _header_at(view: memoryview, pos: int) -> int | None:
    """The record length at `pos` if its length CRC verifies (and it is not absurd), else None."""
    length, length_crc = _HEADER.unpack_from(view, pos)
    if length > MAX_RECORD_BYTES or masked_crc32c(view[pos : pos + 8]) != length_crc:
        return None
    return length


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


def scan(
    buffer: bytes | memoryview, base_offset: int = 0, final: bool = False, more_to_read: bool = False
) -> ScanResult:
    """Split `buffer` (file bytes starting at `base_offset`) into complete records. With `final` (the
    writer is gone and the buffer reaches the end of the file) a cut-short tail is damage too.

    A damaged region with no intact record after it yet is left for the next read (the writer may still
    be writing what follows), so that one region is reported once, whole; it is reported up to where the
    buffer ends only when the file holds more than the buffer (`more_to_read`) or at the end (`final`)."""
    view = memoryview(buffer)
    result = ScanResult()
    pos = 0
    end = len(view)
    while end - pos >= HEADER_SIZE:
        length = _header_at(view, pos)
        if length is None:
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
            continue
        total = HEADER_SIZE + length + FOOTER_SIZE
        if end - pos < total:
            break  # partial last record: wait for the writer
        data = view[pos + HEADER_SIZE : pos + HEADER_SIZE + length]
        (data_crc,) = _FOOTER.unpack_from(view, pos + HEADER_SIZE + length)
        if masked_crc32c(data) != data_crc:
            result.damage.append(Damage(base_offset + pos, total, BAD_DATA_CRC))
        else:
            result.records.append((base_offset + pos + total, bytes(data)))
        pos += total
    if final and pos < end:
        result.damage.append(Damage(base_offset + pos, end - pos, CUT_SHORT))
        pos = end
    result.consumed = pos
    return result


def iter_file_records(path: str, offset: int = 0) -> Iterator[tuple[int, bytes]]:
    """Every complete, intact record of a file from `offset` (a convenience for tests and tools)."""
    with open(path, "rb") as handle:
        handle.seek(offset)
        found = scan(handle.read(), offset)
    yield from found.records
