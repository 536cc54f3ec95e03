"""Progress bars for the CLI's uploads and downloads (rich), on standard error and only when it is a
terminal; `--quiet` turns them off. Callers get a plain callable `advance(nbytes)` either way."""

from __future__ import annotations

import contextlib
import sys
import threading
from collections.abc import Callable, Iterator

quiet_option_help = "No progress bars (they are also off when standard error is not a terminal)."


@contextlib.contextmanager
def byte_progress(label: str, total: int, *, quiet: bool = False) -> Iterator[Callable[[int], None]]:
    """A bar for `total` bytes labelled `label`; yields advance(n), safe to call from several threads."""
    if quiet or not sys.stderr.isatty() or total <= 0:
        yield lambda _n: None
        return
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        DownloadColumn,
        Progress,
        TextColumn,
        TimeRemainingColumn,
        TransferSpeedColumn,
    )

    lock = threading.Lock()
    columns = (
        TextColumn("{task.description}"),
        BarColumn(),
        DownloadColumn(),
        TransferSpeedColumn(),
        TimeRemainingColumn(),
    )
    with Progress(*columns, console=Console(stderr=True), transient=False) as progress:
        task = progress.add_task(label, total=total)

        def advance(n: int) -> None:
            with lock:
                progress.update(task, advance=n)

        yield advance


def reading(handle, advance: Callable[[int], None], block: int = 1024 * 1024) -> Iterator[bytes]:
    """The bytes of an open file in blocks, reporting each to advance (an upload body with progress)."""
    while data := handle.read(block):
        advance(len(data))
        yield data
