"""tar.gz archives for the archive tests: one honest one and the attacks the server must refuse."""

from __future__ import annotations

import gzip
import io
import tarfile
import zlib
from collections.abc import Iterator


def build(members: list[tuple[tarfile.TarInfo, bytes | None]]) -> bytes:
    raw = io.BytesIO()
    with gzip.GzipFile(fileobj=raw, mode="wb", mtime=0) as gz, tarfile.open(fileobj=gz, mode="w") as tar:
        for info, data in members:
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    return raw.getvalue()


def file(name: str, data: bytes = b"x") -> tuple[tarfile.TarInfo, bytes]:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    return info, data


def link(name: str, target: str, kind: bytes = tarfile.SYMTYPE) -> tuple[tarfile.TarInfo, None]:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.linkname = target
    return info, None


def device(name: str) -> tuple[tarfile.TarInfo, None]:
    info = tarfile.TarInfo(name)
    info.type = tarfile.CHRTYPE
    info.devmajor, info.devminor = 1, 3
    return info, None


def honest() -> bytes:
    return build(
        [
            file("train.py", b"print('hello from the source archive')\n"),
            file("pkg/util.py", b"X = 1\n"),
            link("pkg/alias.py", "util.py"),
        ]
    )


def dotdot() -> bytes:
    return build([file("ok.py"), file("../evil.py")])


def absolute() -> bytes:
    return build([file("/etc/cron.d/evil")])


def symlink_escape() -> bytes:
    return build([file("ok.py"), link("data", "../../etc")])


def hardlink_escape() -> bytes:
    return build([file("ok.py"), link("h", "../outside", tarfile.LNKTYPE)])


def device_file() -> bytes:
    return build([device("dev/null")])


def many_tiny_files(count: int = 10_000) -> bytes:
    return build([file(f"f/{i:05d}.txt", b"") for i in range(count)])


def bomb(size: int = 16 * 1024 * 1024) -> bytes:
    """A small archive (tens of KiB) whose one member inflates to `size` bytes of zeros."""
    return build([file("zeros.bin", bytes(size))])


def gzip_stream(blocks: Iterator[bytes]) -> bytes:
    """gzip-compress what `blocks` yields, block by block (nothing the size of the inflated whole)."""
    compressor = zlib.compressobj(6, zlib.DEFLATED, 31)
    return b"".join(compressor.compress(block) for block in blocks) + compressor.flush()


def _header(name: str, size: int, kind: bytes) -> bytes:
    info = tarfile.TarInfo(name)
    info.size, info.type = size, kind
    return info.tobuf(format=tarfile.USTAR_FORMAT)


def huge_extended_header(size: int = 200 * 1024**2, kind: bytes = tarfile.XHDTYPE) -> bytes:
    """A tar.gz (about size/1000 bytes) whose first block declares a PAX header (or GNU long name) of
    `size` bytes, followed by that many bytes: generated as a stream, never held inflated."""

    def blocks() -> Iterator[bytes]:
        yield _header("././@PaxHeader" if kind == tarfile.XHDTYPE else "././@LongLink", size, kind)
        chunk = b"a" * (1024 * 1024)
        for _ in range(size // len(chunk)):
            yield chunk
        yield b"a" * (size % len(chunk))
        yield bytes(-size % 512)
        yield _header("train.py", 1, tarfile.REGTYPE) + b"x" + bytes(511) + bytes(1024)

    return gzip_stream(blocks())


def long_member_name(length: int = 8192) -> bytes:
    return build([file("d/" + "n" * length)])


def symlink_chain_escape() -> bytes:
    """`sub/up -> ..` points at the root (inside); `esc -> sub/up/..` reads as `sub` textually but an
    extractor follows sub/up to the root and `..` above it."""
    return build([file("ok.py"), link("sub/up", ".."), link("esc", "sub/up/..")])


def write_through_link_chain() -> bytes:
    """`a -> sub/up` (the root), `b -> a/..` (above the root), then a file written through b."""
    return build(
        [file("ok.py"), link("sub/up", ".."), link("a", "sub/up"), link("b", "a/.."), file("b/x.py")]
    )


def with_trailing(data: bytes) -> bytes:
    """An honest tar whose end-of-archive marker is followed by `data` (inside the gzip stream)."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        info = tarfile.TarInfo("train.py")
        info.size = 3
        archive.addfile(info, io.BytesIO(b"x=1"))
    return gzip.compress(buffer.getvalue() + data)
