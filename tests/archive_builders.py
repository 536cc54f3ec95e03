"""tar.gz archives for the archive tests: one honest one and the attacks the server must refuse."""

from __future__ import annotations

import gzip
import io
import tarfile


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
