"""TFRecord framing (the container of TensorBoard event files), read without TensorFlow.

Each record: u64 little-endian length, u32 masked CRC32C of those 8 bytes, the data, u32 masked CRC32C of
the data. A record cut short at the end of the file is normal while the writer runs: reading stops before
it and the caller resumes from the same offset later. A bad length CRC means the framing is lost, so the
rest of the file cannot be trusted and reading ends there for good. A bad data CRC skips that one record
(its length is still trustworthy) and is counted, so the caller can raise a health flag.
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


@dataclass
class ScanResult:
    """What one pass over a buffer found."""

    records: list[tuple[int, bytes]] = field(default_factory=list)  # (offset just past the record, data)
    consumed: int = 0  # bytes of the buffer fully handled (complete records, including skipped bad ones)
    bad_data_crc: int = 0
    framing_lost: bool = False  # a bad length CRC: nothing after `consumed` can be read


def scan(buffer: bytes | memoryview, base_offset: int = 0) -> ScanResult:
    """Split `buffer` (file bytes starting at `base_offset`) into complete records."""
    view = memoryview(buffer)
    result = ScanResult()
    pos = 0
    end = len(view)
    while end - pos >= HEADER_SIZE:
        length, length_crc = _HEADER.unpack_from(view, pos)
        if masked_crc32c(view[pos : pos + 8]) != length_crc or length > MAX_RECORD_BYTES:
            result.framing_lost = True
            break
        total = HEADER_SIZE + length + FOOTER_SIZE
        if end - pos < total:
            break  # partial last record: wait for the writer
        data = view[pos + HEADER_SIZE : pos + HEADER_SIZE + length]
        (data_crc,) = _FOOTER.unpack_from(view, pos + HEADER_SIZE + length)
        pos += total
        if masked_crc32c(data) != data_crc:
            result.bad_data_crc += 1
        else:
            result.records.append((base_offset + pos, bytes(data)))
    result.consumed = pos
    return result


def iter_file_records(path: str, offset: int = 0) -> Iterator[tuple[int, bytes]]:
    """Every complete, intact record of a file from `offset` (a convenience for tests and tools)."""
    with open(path, "rb") as handle:
        handle.seek(offset)
        found = scan(handle.read(), offset)
    yield from found.records
