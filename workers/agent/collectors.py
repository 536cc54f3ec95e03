"""The agent's side of each member's metrics collector: start it with the member, keep it alive while the
member runs, and after the member exits let it drain every file to its end, within a bounded time.

- start: the collector starts right after the member's runner (its spool and token are under the agent's
  private state directory, `<state-dir>/spool/<member id>/`, so a collector can be restarted after kill -9
  or after an agent restart). It is spawned with SIGTERM blocked; the collector installs its handler and
  then unblocks it, so a stop that comes before its start-up finished waits instead of killing it.
- watch: a collector that died while its member runs (kill -9, a crash) is restarted, with a delay that
  doubles per death in a row; it resumes from its spool (every point exactly once).
- drain: when the member has exited the agent writes the `member-exited` marker into the spool and sends
  SIGTERM. The collector reads every file to its end, ships, and sends its final batch (which makes the
  member's metrics `complete`), then writes `final-sent`. A collector that dies before that is started
  again (the marker tells it to drain at once); the agent waits at most `drain_timeout` seconds.
- retire: the drain ends at `final-sent`, not at the collector's exit (the member's end is reported
  without waiting for an interpreter to wind down); a collector still alive EXIT_GRACE seconds after
  `final-sent` is killed, and its spool is removed once it is gone (ADR 0165).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from tuneplane.app.security import new_token, token_hash
from tuneplane.app.telemetry.tokens import TOKEN_PREFIX
from tuneplane.workers.agent.directories import AgentPaths
from tuneplane.workers.agent.member_records import MemberRecord, MemberStore, member_tag
from tuneplane.workers.collector.markers import EXIT_GRACE, FINAL_SENT, MEMBER_EXITED
from tuneplane.workers.proctree import alive, start_time, stop_signals_blocked

log = logging.getLogger("tuneplane.agent.collectors")

TOKEN_FILE = "token"
# A token made at PREPARE, its hash sent with member_prepared; issued at COMMIT (take_pending_token).
PENDING_TOKEN_FILE = "token.pending"
DRAIN_TIMEOUT = 60.0
WATCH_INTERVAL = 0.5
MAX_RESTART_DELAY = 30.0
HEALTHY_AFTER = 60.0  # a collector that ran this long before dying restarts without delay


def _gpu_indices(member_dir: Path) -> list[int]:
    """The GPUs the member was given (member.json, written at prepare)."""
    try:
        return [int(g) for g in json.loads((member_dir / "member.json").read_text()).get("gpu_indices") or []]
    except (OSError, ValueError, TypeError):
        return []


class MemberCollectors:
    def __init__(
        self,
        paths: AgentPaths,
        store: MemberStore,
        settings: dict,
        say: Callable[[str], None],
        env_drop: tuple[str, ...],
        node: Callable[[], str | None] = lambda: None,
    ) -> None:
        self.paths = paths
        self.spool_root = paths.state_dir / "spool"
        self.store = store
        self.settings = settings  # telemetry_url, ca_bundle, collector_drain_timeout, sample_interval
        self.node = node  # the node's name once known (part of the collector id)
        self.say = say
        self.env_drop = env_drop
        self.processes: dict[int, subprocess.Popen] = {}
        self.watchers: dict[int, asyncio.Task] = {}
        # member id → the task that waits for a drained collector to exit (bounded) and removes its spool
        self.retiring: dict[int, asyncio.Task] = {}
        self.restarts: dict[int, int] = {}

    def spool_dir(self, member_id: int) -> Path:
        return self.spool_root / str(int(member_id))

    # ---- start ----------------------------------------------------------------------------------------

    def start(self, record: MemberRecord, member_dir: Path, token: str) -> None:
        """Start the member's collector and keep it alive while the member runs."""
        self.keep_token(record, token)
        self.start_after_report(record, member_dir)

    def pending_token_hash(self, record: MemberRecord) -> str:
        """The sha256 of the token this member's collector will use, made while it prepares (kept 0600 in
        its spool, apart from the kept token: nothing collects with it before COMMIT issued it). The same
        token on every call, so a prepare done again (the agent restarted) sends the hash already stored."""
        spool = self.spool_dir(record.member_id)
        path = spool / PENDING_TOKEN_FILE
        try:
            return token_hash(path.read_text().strip())
        except (OSError, ValueError):
            pass
        plaintext, digest = new_token(TOKEN_PREFIX)
        spool.mkdir(parents=True, exist_ok=True, mode=0o700)
        tmp = path.with_name(path.name + ".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as handle:
            handle.write(plaintext)
        os.replace(tmp, path)
        return digest

    def take_pending_token(self, record: MemberRecord) -> str | None:
        """START said COMMIT issued the pending token: it becomes the member's kept token (keep_token)."""
        spool = self.spool_dir(record.member_id)
        try:
            plaintext = (spool / PENDING_TOKEN_FILE).read_text().strip()
            os.replace(spool / PENDING_TOKEN_FILE, spool / TOKEN_FILE)
        except OSError:
            return None
        return plaintext or None

    def forget_pending_token(self, member_id: int) -> None:
        """A launch that aborted: its token was never issued."""
        spool = self.spool_dir(member_id)
        (spool / PENDING_TOKEN_FILE).unlink(missing_ok=True)
        with contextlib.suppress(OSError):
            spool.rmdir()  # only when nothing else is in it

    def keep_token(self, record: MemberRecord, token: str) -> None:
        """The member's token in its spool (0600): from here on the member has a collector — one whose
        member exits before it was spawned is spawned by the drain, which finds this token."""
        spool = self.spool_dir(record.member_id)
        spool.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd = os.open(spool / TOKEN_FILE, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as handle:
            handle.write(token)

    def start_after_report(self, record: MemberRecord, member_dir: Path) -> None:
        """Spawn the collector of a member whose token is kept, unless its member already ended (the drain
        spawns it then) or one runs; then keep it alive. On the event loop, as the drain is: never both."""
        if not self.has_token(record):
            return
        exited = (self.spool_dir(record.member_id) / MEMBER_EXITED).exists()
        if record.state == "running" and not exited and not self.running(record):
            self._spawn(record, member_dir)
        self.watch(record, member_dir)

    def _spawn(self, record: MemberRecord, member_dir: Path) -> bool:
        spool = self.spool_dir(record.member_id)
        try:
            token = (spool / TOKEN_FILE).read_text().strip()
        except OSError:
            self.say(f"member {record.member_id}: no collector token kept; its metrics are not collected")
            return False
        env = {k: v for k, v in os.environ.items() if k not in self.env_drop}
        env["TUNEPLANE_TELEMETRY_TOKEN"] = token
        argv = [
            sys.executable,
            "-P",
            "-m",
            "tuneplane",
            "collector",
            "--output-dir",
            str(member_dir / "output"),
            "--spool-dir",
            str(spool),
            "--gateway",
            self.settings["telemetry_url"],
            "--collector-id",
            f"{self.node() or 'node'}-m{record.member_id}",
            "--job-id",
            str(record.job_id),
            "--attempt",
            str(record.attempt),
            "--member",
            str(record.rank),
            # Host and GPU samples of the member's processes and GPUs (workers/collector/system.py).
            "--member-tag",
            member_tag(self.paths, record.member_id),
            "--gpus",
            ",".join(str(g) for g in _gpu_indices(member_dir)),
        ]
        if self.settings.get("sample_interval") is not None:
            argv += ["--sample-interval", str(self.settings["sample_interval"])]
        if self.settings.get("ca_bundle"):
            argv += ["--ca-bundle", self.settings["ca_bundle"]]
        (member_dir / "logs").mkdir(parents=True, exist_ok=True)
        try:
            with open(member_dir / "logs" / "collector.log", "ab") as out, stop_signals_blocked():
                process = subprocess.Popen(
                    argv,
                    env=env,
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
        except OSError as exc:
            self.say(f"member {record.member_id}: collector not started ({exc})")
            return False
        self.processes[record.member_id] = process
        record.collector_pid, record.collector_started = process.pid, start_time(process.pid)
        self.store.save(record, sync=False)  # fsync'd only when the member already ended (MemberStore.save)
        return True

    def running(self, record: MemberRecord) -> bool:
        process = self.processes.get(record.member_id)
        if process is not None:
            return process.poll() is None
        return bool(record.collector_pid) and alive(record.collector_pid, record.collector_started)

    def has_token(self, record: MemberRecord) -> bool:
        return (self.spool_dir(record.member_id) / TOKEN_FILE).exists()

    # ---- keep alive while the member runs -------------------------------------------------------------

    def watch(self, record: MemberRecord, member_dir: Path) -> None:
        """Restart the collector whenever it dies while the member runs (also after an agent restart)."""
        if not self.has_token(record):
            return
        task = self.watchers.get(record.member_id)
        if task is None or task.done():
            self.watchers[record.member_id] = asyncio.get_running_loop().create_task(
                self._keep_alive(record.member_id, member_dir), name=f"collector-{record.member_id}"
            )

    async def _keep_alive(self, member_id: int, member_dir: Path) -> None:
        delay = 0.0
        started = time.monotonic()
        while True:
            record = self.store.get(member_id)
            if record is None or record.state != "running":
                return  # the drain (or nothing) takes over
            spool = self.spool_dir(member_id)
            if (spool / MEMBER_EXITED).exists():
                return
            if not self.running(record):
                died = self._death(record)
                if time.monotonic() - started > HEALTHY_AFTER:
                    delay = 0.0  # it ran well for a while: this death starts a new series
                self.restarts[member_id] = self.restarts.get(member_id, 0) + 1
                self.say(f"member {member_id}: collector {died}; restarting it (it resumes from its spool)")
                if delay:
                    await asyncio.sleep(delay)
                await asyncio.to_thread(self._spawn, record, member_dir)
                started = time.monotonic()
                delay = min(MAX_RESTART_DELAY, max(0.5, delay * 2))
            await asyncio.sleep(WATCH_INTERVAL)

    def _death(self, record: MemberRecord) -> str:
        """Forget a dead collector (its pid too, so the death is noticed once) and say how it ended."""
        record.collector_pid = record.collector_started = None
        process = self.processes.pop(record.member_id, None)
        if process is None or process.returncode is None:
            return "is gone"
        code = process.returncode
        return f"killed by signal {-code}" if code < 0 else f"exited with status {code}"

    # ---- drain after the member exited ----------------------------------------------------------------

    async def drain(self, record: MemberRecord, member_dir: Path) -> bool:
        """Tell the collector its member exited and wait (bounded) until it has read every file to its end
        and its final batch is acknowledged; restart it if it dies first. True when it finished."""
        spool = self.spool_dir(record.member_id)
        if not self.has_token(record):
            return True  # this member ran without a collector
        task = self.watchers.pop(record.member_id, None)
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        if not (spool / MEMBER_EXITED).exists():
            (spool / MEMBER_EXITED).write_text(f"{time.time()}\n")
        timeout = float(self.settings.get("collector_drain_timeout") or DRAIN_TIMEOUT)
        deadline = time.monotonic() + timeout
        signalled = False
        restart_at, delay = 0.0, 0.0
        while not (spool / FINAL_SENT).exists():
            if time.monotonic() >= deadline:
                self.say(
                    f"member {record.member_id}: collector did not finish its drain in {timeout:g}s; "
                    "what it has not sent stays in its spool"
                )
                self._terminate(record)
                return False
            if not self.running(record):
                if self.processes.get(record.member_id) is not None or record.collector_pid:
                    died = self._death(record)
                    if (spool / FINAL_SENT).exists():
                        break
                    self.say(
                        f"member {record.member_id}: collector {died} before its drain ended; restarting"
                    )
                    # One that keeps failing at once is not started twenty times a second.
                    restart_at, delay = time.monotonic() + delay, min(5.0, max(0.5, delay * 2))
                if time.monotonic() < restart_at:
                    await asyncio.sleep(0.05)
                    continue
                if not await asyncio.to_thread(self._spawn, record, member_dir):
                    return False
                signalled = False
            elif not signalled:
                self._signal(record, signal.SIGTERM)
                signalled = True
            await asyncio.sleep(0.05)
        # Its work is done and the token revoked with the final batch: no copy of it stays on disk.
        (spool / TOKEN_FILE).unlink(missing_ok=True)
        self.retiring[record.member_id] = asyncio.get_running_loop().create_task(
            self._retire(record, spool), name=f"collector-retire-{record.member_id}"
        )
        return True

    async def _retire(self, record: MemberRecord, spool: Path) -> None:
        """A drained collector: at most EXIT_GRACE seconds to exit, then SIGKILL; then its spool goes (every
        batch is acknowledged), unless it holds batches the gateway refused: those stay, with their
        reasons, for the operator."""
        try:
            deadline = time.monotonic() + EXIT_GRACE
            while self.running(record) and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            if self.running(record):
                self.say(
                    f"member {record.member_id}: collector still running {EXIT_GRACE:g}s after its drain; "
                    "killed"
                )
                self._signal(record, signal.SIGKILL)
            await asyncio.to_thread(self._reap, record)
            if not any((spool / "rejected").glob("*")):
                await asyncio.to_thread(shutil.rmtree, spool, True)
        finally:
            self.retiring.pop(record.member_id, None)

    def _signal(self, record: MemberRecord, signum: int) -> None:
        if record.collector_pid and alive(record.collector_pid, record.collector_started):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(record.collector_pid, signum)

    def _terminate(self, record: MemberRecord) -> None:
        self._signal(record, signal.SIGKILL)
        self._reap(record)

    def _reap(self, record: MemberRecord) -> None:
        process = self.processes.pop(record.member_id, None)
        if process is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(10)
