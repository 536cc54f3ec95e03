"""The agent's launch handlers: prepare, start, stop, abort, kill, and reconcile on every new session.

prepare  runs as its own asyncio task (a cold preparation never blocks heartbeats or other members):
         fetch the capsule over the gateway's HTTP side, verify and unpack it into the member directory,
         unpack the source, materialize the pinned inputs, check the runtime pin, the peer network and the
         shared storage, then report member_prepared or member_prepare_failed with the reason.
start    spawns `tuneplane runner` in its own session (it survives an agent crash), records member → pid
         in the state directory before reporting member_started, starts the member's collector with a
         token scoped to the member, and watches it. A START for a member whose runner is alive (it
         holds the lock on the member directory: an agent killed between spawn and record, a
         redelivered START) adopts that runner; one whose runner already finished adopts its result.
         A member is never spawned twice.
end      the moment a member's runner is gone, the agent writes its durable end record (exit status as
         the runner's keeper wrote it, end time, outputs to deliver, the `member_exited` report as
         unacknowledged) before anything else; then it starts the output delivery (workers.agent.
         delivery, retried until a deadline), waits for its first pass and the log drain, and reports
         the exit. Until the control plane acknowledges it, every reconcile lists the member as ended
         with that status: a reconnect or an agent restart in that window can never make it "gone".
stop     SIGTERM to every process of the member, SIGKILL after the grace period.
abort    cancels an in-flight prepare and deletes the member's workspace (nothing was started).
kill     stops members the control plane no longer considers live here (orphans after a fence).
On every new control session the agent first reports `reconcile` (what still runs, what ended while it
was away) and then re-sends any report the control plane has not acknowledged.
Every handler is idempotent per member id: a command delivered twice does its work once.
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
import time
from pathlib import Path
from typing import Any, NoReturn

from tuneplane.app.security import new_token
from tuneplane.app.telemetry.tokens import TOKEN_PREFIX as TELEMETRY_TOKEN_PREFIX
from tuneplane.workers.agent.checkpoints import CheckpointWatchers
from tuneplane.workers.agent.collectors import MemberCollectors
from tuneplane.workers.agent.delivery import DEFAULT_DEADLINE, Delivery, plan_deliveries
from tuneplane.workers.agent.disk_cleanup import schedule_clean_caches
from tuneplane.workers.agent.environments import progress_reporter
from tuneplane.workers.agent.handlers import SESSION_HOOKS, AgentContext, CommandFailed, command
from tuneplane.workers.agent.logship import ship_logs
from tuneplane.workers.agent.member_records import (
    MemberRecord,
    MemberStore,
    member_dir,
    member_tag,
    pending,
    settled,
    tag_suffix,
)
from tuneplane.workers.agent.prepare import NodeAccess, PrepareFailed, prepare_member_dir
from tuneplane.workers.agent.probe import ProbeServer
from tuneplane.workers.agent.session import Refused
from tuneplane.workers.agent.standby_runners import StandbyRunners
from tuneplane.workers.capsule import CapsuleError
from tuneplane.workers.proctree import (
    TAG_VARIABLE,
    alive,
    descendants,
    member_processes,
    signal_all,
    start_time,
    tagged,
    zombie_children,
)
from tuneplane.workers.runner import runner_command
from tuneplane.workers.runner.process import member_lock_held, read_exit_status, read_runner_pids
from tuneplane.workers.runner.runtime import RuntimeRefused

log = logging.getLogger("tuneplane.agent.launch")

# Never handed to a runner (which strips every TUNEPLANE_* for the workload anyway).
RUNNER_ENV_DROP = (
    "TUNEPLANE_DATABASE_URL",
    "TUNEPLANE_ENROLL_TOKEN",
    "TUNEPLANE_NODE_CREDENTIAL",
    "TUNEPLANE_TOKEN",
    "TUNEPLANE_TELEMETRY_TOKEN",
    TAG_VARIABLE,
)
WATCH_INTERVAL = 0.2
REAP_INTERVAL = 1.0
# Reports whose acknowledgement is not written to the record at once (see report()).
LAUNCH_REPORTS = frozenset({"member_prepared", "member_started"})
# How long a KILL waits for a member's processes to be gone before it is answered with an error.
KILL_WAIT = 10.0


def _say(ctx: AgentContext, line: str) -> None:
    say = ctx.extra.get("say")
    if say is not None:
        say(line)
    else:
        log.info(line)


class LaunchAgent:
    """Per-agent launch state: member records, in-flight prepares, watchers and the probe server."""

    def __init__(self, ctx: AgentContext) -> None:
        assert ctx.paths is not None
        self.ctx = ctx
        self.paths = ctx.paths
        self.store = MemberStore(self.paths.state_dir / "members")
        self.prepares: dict[int, asyncio.Task] = {}
        self.watchers: dict[int, asyncio.Task] = {}
        self.killers: dict[int, asyncio.Task] = {}
        # Log shippers (workers.agent.logship), one per running member, with the event that ends them.
        self.shippers: dict[int, tuple[asyncio.Task, asyncio.Event]] = {}
        self.runners: dict[int, subprocess.Popen] = {}
        # Each member's metrics collector: started just after its runner, kept alive, drained after it
        # (collectors.py).
        self.collectors = MemberCollectors(
            self.paths, self.store, ctx.extra, lambda line: _say(ctx, line), RUNNER_ENV_DROP, lambda: ctx.node
        )
        # Runners started before their member (standby_runners.py), `standby_runners` of them.
        self.standby = StandbyRunners(
            int(ctx.extra.get("standby_runners", 1) or 0),
            lambda: self._runner_env(None, None),
            self.paths.state_dir,
            lambda line: _say(ctx, line),
        )
        # Children no longer tracked per member, waited for by the reaper (no zombies under the agent).
        self.retired: list[subprocess.Popen] = []
        self.reaper: asyncio.Task | None = None
        self.deliveries: dict[int, Delivery] = {}
        # Members whose end is being finished (delivery's first pass, log drain, exit report).
        self.finishing: dict[int, asyncio.Task] = {}
        self.probe: ProbeServer | None = None
        # Checkpoints published while members run (workers.agent.checkpoints).
        self.checkpoints = CheckpointWatchers(self.paths, self.access, lambda line: _say(ctx, line))
        self.publish()

    # ---- reports ------------------------------------------------------------------------------------

    async def send(self, kind: str, payload: dict) -> Any:
        """Send now, or raise ConnectionError (not connected / connection lost) or Refused."""
        if self.ctx.report is None:
            raise ConnectionError("no control session")
        return await self.ctx.report(kind, payload)

    async def report(self, record: MemberRecord | None, kind: str, payload: dict, saved: bool = False) -> Any:
        """Send a member's report; if it cannot be sent now, keep it in the record for the next session.
        `saved`: the caller just saved the record with this report already in `unreported` (one write, not
        two, on the launch path: each is a write on the event loop)."""
        if record is not None and not saved:
            record.unreported[kind] = payload
            self.keep(record)
        try:
            result = await self.send(kind, payload)
        except (ConnectionError, TimeoutError, RuntimeError) as exc:
            _say(self.ctx, f"member {payload.get('member_id')}: {kind} not sent yet ({exc}); will resend")
            return None
        except Refused as exc:
            if exc.status == 409 and "session" in exc.message:
                return None  # a newer session replaced ours; that session re-sends it
            _say(self.ctx, f"member {payload.get('member_id')}: {kind} refused: {exc.message}")
            result = {"refused": exc.message}
        if record is not None and self.store.get(record.member_id) is record:
            record.unreported.pop(kind, None)
            # Acknowledged launch reports are forgotten in memory only: the next write of the record (START's,
            # the end's) carries that, and one resent after a restart in between is answered as before
            # (both are idempotent). This write would sit between member_started and the workload's go.
            if kind not in LAUNCH_REPORTS:
                self.keep(record)
        return result

    def keep(self, record: MemberRecord, sync: bool = True) -> bool:
        """Save a member's record; when the state directory cannot take it (the disk is full) say so and
        go on from the record in memory: a report must never wait on the disk, or the job would show a
        member running (or preparing) for ever. Only START needs its record on disk (see start)."""
        error = self.store.keep(record, sync)
        if error is not None:
            _say(self.ctx, f"member {record.member_id}: its record could not be written ({error}); going on")
        return error is None

    def publish(self) -> None:
        """What heartbeats carry: the members this agent runs."""
        self.ctx.running = [
            {"member_id": r.member_id, "pid": r.pid, "state": r.state}
            for r in self.store.all()
            if r.state == "running"
        ]

    # ---- prepare ------------------------------------------------------------------------------------

    def accept_prepare(self, payload: dict) -> dict:
        member_id = int(payload["member_id"])
        record = self.store.get(member_id)
        task = self.prepares.get(member_id)
        if task is not None and not task.done():
            return {"state": "preparing"}
        if record is not None and record.state != "preparing":
            if record.state in ("prepared", "failed"):
                kind = "member_prepared" if record.state == "prepared" else "member_prepare_failed"
                outcome = record.unreported.get(kind) or {"member_id": member_id, "reason": record.reason}
                asyncio.get_running_loop().create_task(self.report(record, kind, outcome))
            return {"state": record.state}
        record = MemberRecord(
            member_id=member_id,
            attempt_id=int(payload["attempt_id"]),
            job_id=int(payload["job_id"]),
            attempt=int(payload["attempt"]),
            rank=int(payload["rank"]),
            prepare_payload=payload,
        )
        self.keep(record, sync=False)  # a launch record (MemberStore.save)
        self._begin_prepare(record, payload)
        return {"state": "preparing", "accepted": True}

    def _begin_prepare(self, record: MemberRecord, payload: dict) -> None:
        self.prepares[record.member_id] = asyncio.get_running_loop().create_task(
            self.prepare_member(record, payload), name=f"prepare-{record.member_id}"
        )

    async def prepare_member(self, record: MemberRecord, payload: dict) -> None:
        checks: dict[str, Any] = {}
        directory = member_dir(self.paths, record.member_id)
        try:
            directory.mkdir(parents=True, exist_ok=True)
            hold = float(self.ctx.extra.get("hold_prepare") or 0)
            if hold > 0:
                _say(self.ctx, f"member {record.member_id}: holding the prepare {hold:g}s (test option)")
                await asyncio.sleep(hold)
            await prepare_member_dir(
                self.access(),
                self.paths.work_dir,
                directory,
                payload,
                self.ctx.node,
                checks,
                simulated_gpus=bool(self.ctx.extra.get("simulated_gpus")),
                progress=progress_reporter(self.send, record.member_id),
            )
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # every failure is the member's prepare failure, with its reason
            reason = (
                str(exc)
                if isinstance(exc, PrepareFailed | CapsuleError | RuntimeRefused)
                else (f"{type(exc).__name__}: {exc}")
            )
            record.state, record.reason, record.prepare_payload = "failed", reason, None
            self.keep(record, sync=False)
            _say(self.ctx, f"member {record.member_id}: prepare failed: {reason}")
            await self.report(
                record, "member_prepare_failed", {"member_id": record.member_id, "reason": reason, **checks}
            )
            return
        prepared: dict[str, Any] = {"member_id": record.member_id, **checks}
        if self.ctx.extra.get("telemetry_url"):
            # Issued at COMMIT, so START needs no token round trip (migration 0230).
            try:
                prepared["telemetry_token_hash"] = self.collectors.pending_token_hash(record)
            except OSError as exc:
                _say(self.ctx, f"member {record.member_id}: no telemetry token made ({exc}); START asks")
        record.state, record.reason, record.prepare_payload = "prepared", "prepared", None
        record.unreported["member_prepared"] = prepared
        self.keep(record, sync=False)
        schedule_clean_caches(self.paths.work_dir, self.store.all, self.send)
        _say(self.ctx, f"member {record.member_id} (job {record.job_id} rank {record.rank}) prepared")
        await self.report(record, "member_prepared", prepared, saved=True)

    def _credential(self) -> str:
        stored = self.ctx.extra["credential_store"].load()
        if stored is None:
            raise PrepareFailed("this agent has no node credential")
        return stored.credential

    def access(self) -> NodeAccess:
        return NodeAccess(
            self.ctx.extra["server"],
            self.ctx.extra["http"],
            self._credential,
            self.ctx.extra.get("ca_bundle"),
        )

    # ---- abort --------------------------------------------------------------------------------------

    async def abort(self, member_id: int, reason: str) -> dict:
        task = self.prepares.pop(member_id, None)
        if task is not None and not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        record = self.store.get(member_id)
        if record is not None and record.state == "running":
            # Cannot happen by the protocol (START only after COMMIT); be safe rather than leave it running.
            await self.stop(member_id, reason, grace=2.0)
            return {"member_id": member_id, "stopping": True}
        directory = member_dir(self.paths, member_id)
        await asyncio.to_thread(shutil.rmtree, directory, True)
        self.collectors.forget_pending_token(member_id)
        self.store.forget(member_id)
        self.publish()
        _say(self.ctx, f"member {member_id}: aborted ({reason}); workspace removed")
        return {"member_id": member_id, "cleaned": True}

    # ---- start --------------------------------------------------------------------------------------

    async def start(self, member_id: int, token_issued: bool = False) -> dict:
        """START: spawn the member's runner, record it, report member_started. `token_issued`: COMMIT
        issued the telemetry token made at PREPARE (START's `telemetry_token`), so none is asked for."""
        record = self.store.get(member_id)
        if record is None:
            await self._cannot_start(member_id, "it was never prepared on this node")
        if record.state == "running":
            self.ensure_watcher(record)
            await self.report(record, "member_started", {"member_id": member_id, "pid": record.pid})
            return {"member_id": member_id, "pid": record.pid, "already": True}
        if record.state == "ended":
            return {"member_id": member_id, "already": "ended"}
        if record.state != "prepared":
            await self._cannot_start(member_id, f"it is {record.state} on this node, not prepared")
        directory = member_dir(self.paths, member_id)
        found = await self._existing_run(directory)
        if found is not None:
            return await self._adopt(record, directory, *found)
        token = self.collectors.take_pending_token(record) if token_issued else None
        if token is None:
            token = await self._telemetry_token(record)
        env = self._runner_env(member_id, token)
        logs = directory / "logs"
        logs.mkdir(exist_ok=True)
        # A standby runner's interpreter is already up (ADR 0240): it takes the member's lock now and starts
        # the workload at go(), once the start is reported below.
        runner = self.standby.hand(directory, env)
        if runner is None:
            with open(logs / "runner.log", "ab") as out:
                runner = subprocess.Popen(
                    runner_command(directory),
                    cwd=directory,
                    env=env,
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
        # Tracked at once, so the child is waited for even if this START never completes (its session
        # ended meanwhile: the redelivered START adopts the run, and the reaper still reaps the runner).
        self.runners[member_id] = runner
        if token:
            # Its token now, so an exit seen from here on drains through a collector; the collector itself
            # once the start is reported (below).
            self.collectors.keep_token(record, token)
        hold = float(self.ctx.extra.get("hold_after_spawn") or 0)
        if hold > 0:
            _say(self.ctx, f"member {member_id}: holding {hold:g}s between spawn and record (test option)")
            await asyncio.sleep(hold)
        record.pid, record.pid_started = runner.pid, start_time(runner.pid)
        record.state, record.reason = "running", "running"
        started = {"member_id": member_id, "pid": runner.pid}
        record.unreported["member_started"] = started
        try:
            self.store.save(record, sync=False)  # before the report: a restarted agent must find this pid
        except OSError as exc:
            await self._unspawn(record, runner, exc)
        self.publish()
        _say(
            self.ctx,
            f"member {member_id} (job {record.job_id} rank {record.rank}) started, runner pid {runner.pid}",
        )
        self.ensure_watcher(record, collector=False)
        try:
            await self.report(record, "member_started", started, saved=True)
        finally:
            self.standby.go(runner)
            # After the report, not before: a collector's interpreter start (0.1-0.2 CPU-s) competes with
            # the agents' reports and the runners on a busy node, and "running" waits for the last report
            # (ADR 0165). It reads every file from its start, so nothing the workload wrote first is missed.
            self.collectors.start_after_report(record, directory)
        return {"member_id": member_id, "pid": runner.pid}

    async def _existing_run(self, directory: Path) -> tuple[int | None, str] | None:
        """(pid, why) when this member already has a run here (a live runner holding the member directory's
        lock, or a finished one's exit status); None when nothing ever ran it. A member never started costs
        two system calls, made here: only waiting for a live runner's pids goes to a thread (a thread hop on
        the launch path waits for a CPU on a node busy starting a gang)."""
        if member_lock_held(directory):
            return await asyncio.to_thread(self._live_run, directory)
        if (directory / "exit_status.json").exists():
            return None, "it already ran and ended"
        return None

    @staticmethod
    def _live_run(directory: Path) -> tuple[int | None, str]:
        """(pid, why) of the run holding a member directory's lock (blocking: waits for its pids file)."""
        pids: dict = {}
        deadline = time.monotonic() + 3.0
        while not pids and time.monotonic() < deadline:  # the runner writes it right after its fork
            pids = read_runner_pids(directory)
            if not pids:
                time.sleep(0.05)
        runner = pids.get("runner")
        if runner and alive(runner, pids.get("runner_started")):
            return runner, f"its runner (pid {runner}) is alive"
        keeper = pids.get("keeper")
        if keeper and alive(keeper, pids.get("keeper_started")):
            return keeper, f"its runner is gone but the workload's keeper (pid {keeper}) is alive"
        return None, "a process of it holds the member directory's lock"

    async def _adopt(self, record: MemberRecord, directory: Path, pid: int | None, why: str) -> dict:
        """START for a member that already runs (or ran) here: record and watch that run, spawn nothing."""
        member_id = record.member_id
        record.pid, record.pid_started = pid, (start_time(pid) if pid else None)
        record.state, record.reason = "running", f"adopted: {why}"
        self.keep(record)
        self.publish()
        _say(self.ctx, f"member {member_id}: adopted, not started again ({why})")
        if await asyncio.to_thread(member_lock_held, directory):
            token = await self._telemetry_token(record)
            if token:
                self.collectors.start(record, directory, token)
        self.ensure_watcher(record)
        await self.report(record, "member_started", {"member_id": member_id, "pid": pid})
        return {"member_id": member_id, "pid": pid, "adopted": why}

    async def _unspawn(self, record: MemberRecord, runner: subprocess.Popen, exc: OSError) -> NoReturn:
        """The runner was spawned but its record could not be written (the state directory's disk is full):
        a run the agent cannot find after a restart must not go on. Kill everything of it, wait until it
        is gone, then fail START with the reason (the control plane releases the member on that error)."""
        member_id = record.member_id
        tag = member_tag(self.paths, member_id)
        for _ in range(100):  # bounded: SIGKILL is not refused; 10 s covers a loaded machine
            pids = await asyncio.to_thread(member_processes, runner.pid, record.pid_started, tag)
            if not pids:
                break
            signal_all(pids, signal.SIGKILL)
            await asyncio.sleep(0.1)
        with contextlib.suppress(subprocess.TimeoutExpired):
            await asyncio.to_thread(runner.wait, 10)
        self.runners.pop(member_id, None)
        self.standby.go(runner)  # it was killed: only its pipe is left to close
        if runner.returncode is None:
            self.retired.append(runner)
        why = f"its runner could not be recorded on this node ({exc}); the runner was killed"
        record.state, record.reason, record.pid, record.pid_started = "failed", why, None, None
        record.unreported.pop("member_started", None)  # never sent: it did not start
        self.keep(record)
        self.publish()
        _say(self.ctx, f"member {member_id}: {why}")
        raise CommandFailed(f"member {member_id}: {why}")

    async def _cannot_start(self, member_id: int, why: str) -> NoReturn:
        """Say the member ended (it never ran) so the attempt does not wait for it, then fail the command."""
        await self.report(
            None,
            "member_exited",
            {"member_id": member_id, "exit_code": None, "reason": f"could not start: {why}"},
        )
        raise CommandFailed(f"member {member_id}: {why}")

    def _runner_env(self, member_id: int | None, token: str | None) -> dict[str, str]:
        """A member's runner environment; with no member, a standby runner's (no tag, no token)."""
        env = {k: v for k, v in os.environ.items() if k not in RUNNER_ENV_DROP}
        if member_id is None:
            return env
        env[TAG_VARIABLE] = member_tag(self.paths, member_id)
        url = self.ctx.extra.get("telemetry_url")
        if token and url:
            env["TUNEPLANE_TELEMETRY_URL"] = url
            env["TUNEPLANE_TELEMETRY_TOKEN"] = token
        return env

    async def _telemetry_token(self, record: MemberRecord) -> str | None:
        """A token scoped to this member: made here, only its hash goes to the control plane."""
        if not self.ctx.extra.get("telemetry_url"):
            return None
        plaintext, digest = new_token(TELEMETRY_TOKEN_PREFIX)
        try:
            await self.send("telemetry_token", {"member_id": record.member_id, "token_hash": digest})
        except (ConnectionError, TimeoutError, RuntimeError, Refused) as exc:
            _say(
                self.ctx,
                f"member {record.member_id}: no telemetry token ({exc}); running without a collector",
            )
            return None
        return plaintext

    # ---- watching, exits ----------------------------------------------------------------------------

    def ensure_watcher(self, record: MemberRecord, collector: bool = True) -> None:
        """Watch a running member: its exit, its checkpoints, its logs, and (unless `collector` is False:
        START spawns it after its report) its collector."""
        task = self.watchers.get(record.member_id)
        if task is None or task.done():
            self.watchers[record.member_id] = asyncio.get_running_loop().create_task(
                self.watch(record.member_id), name=f"watch-{record.member_id}"
            )
        if collector:
            self.collectors.watch(record, member_dir(self.paths, record.member_id))
        self.checkpoints.start(record.member_id)
        shipper = self.shippers.get(record.member_id)
        if shipper is None or shipper[0].done():
            stop = asyncio.Event()
            logs = member_dir(self.paths, record.member_id) / "logs"
            task = asyncio.get_running_loop().create_task(
                ship_logs(self.ctx, record.member_id, logs, stop), name=f"logs-{record.member_id}"
            )
            self.shippers[record.member_id] = (task, stop)

    def running_now(self, record: MemberRecord) -> bool:
        runner = self.runners.get(record.member_id)
        if runner is not None and runner.poll() is None:
            return True
        # The runner, or its keeper after the runner was killed, holds the lock while the member runs.
        if member_lock_held(member_dir(self.paths, record.member_id)):
            return True
        if record.pid and alive(record.pid, record.pid_started):
            return True
        return bool(tagged(member_tag(self.paths, record.member_id)))

    async def watch(self, member_id: int) -> None:
        while True:
            record = self.store.get(member_id)
            if record is None or record.state != "running":
                return
            if not await asyncio.to_thread(self.running_now, record):
                break
            await self._runner_exit(member_id, WATCH_INTERVAL)
        if self.record_end(record):
            await self.finish_end(record)

    async def _runner_exit(self, member_id: int, timeout: float) -> None:
        """Returns when the runner this agent spawned exits (its pidfd turns readable), or after `timeout`:
        the end is seen at once rather than at the next look (ADR 0165). An adopted runner (not our
        child) or a system without pidfd: the timeout alone."""
        runner = self.runners.get(member_id)
        fd = -1
        if runner is not None and runner.returncode is None and hasattr(os, "pidfd_open"):
            with contextlib.suppress(OSError):
                fd = os.pidfd_open(runner.pid)
        if fd < 0:
            await asyncio.sleep(timeout)
            return
        loop = asyncio.get_running_loop()
        exited = loop.create_future()
        loop.add_reader(fd, lambda: exited.done() or exited.set_result(None))
        try:
            await asyncio.wait_for(exited, timeout)
        except TimeoutError:
            pass
        finally:
            loop.remove_reader(fd)
            os.close(fd)

    def exit_of(self, record: MemberRecord) -> tuple[int | None, str]:
        status = read_exit_status(member_dir(self.paths, record.member_id))
        if status is not None:
            return status.get("exit_code"), status.get("reason") or ""
        runner = self.runners.get(record.member_id)
        if runner is not None and runner.returncode is not None:
            return (
                None,
                "the runner and its keeper ended without writing the workload's exit status "
                f"(the runner's own status {runner.returncode})",
            )
        return None, "the runner ended while the agent was away and left no exit status"

    def record_end(self, record: MemberRecord) -> bool:
        """The durable end record, written before anything else happens after a member's end: its exit
        status, end time, the outputs to deliver and the exit report (unacknowledged until the control
        plane takes it). False when the member's end was already recorded."""
        if record.state != "running":
            return False
        code, reason = self.exit_of(record)
        record.state, record.exit_code, record.reason, record.ended_at = "ended", code, reason, time.time()
        record.unreported["member_exited"] = {
            "member_id": record.member_id,
            "exit_code": code,
            "reason": reason,
        }
        directory = member_dir(self.paths, record.member_id)
        deadline = float(self.ctx.extra.get("delivery_deadline") or DEFAULT_DEADLINE)
        plan_deliveries(record, directory, deadline, outputs=code == 0)
        self.keep(record)  # a disk that cannot take it never holds the end back
        runner = self.runners.pop(record.member_id, None)
        if runner is not None:
            self.retired.append(runner)
        self.publish()
        self.checkpoints.member_ended(record.member_id)
        self.ensure_delivery(record)
        return True

    def ensure_delivery(self, record: MemberRecord) -> Delivery | None:
        """The member's delivery task (started if outputs are pending and none runs)."""
        if not pending(record):
            return None
        delivery = self.deliveries.get(record.member_id)
        if delivery is None or delivery.done():
            delivery = self.deliveries[record.member_id] = Delivery(
                self.store,
                record.member_id,
                member_dir(self.paths, record.member_id),
                self.access,
                lambda line: _say(self.ctx, line),
            )
        return delivery

    async def finish_end(self, record: MemberRecord) -> None:
        """After the durable end record: outputs' first delivery pass, the log drain, then the report.

        Waiting for the first pass keeps the usual order (a job seen succeeded has its outputs); a pass
        that has to retry does not hold the exit back. The end is reported after the logs are drained:
        whoever sees it ended can read every line (a reconcile meanwhile reports it from the record)."""
        delivery = self.deliveries.get(record.member_id)
        shipper = self.shippers.pop(record.member_id, None)
        if shipper is None:  # ended while the agent was away: a shipper that only drains what is left
            stop = asyncio.Event()
            logs = member_dir(self.paths, record.member_id) / "logs"
            shipper = (
                asyncio.get_running_loop().create_task(ship_logs(self.ctx, record.member_id, logs, stop)),
                stop,
            )
        shipper[1].set()

        async def first_delivery() -> None:
            if delivery is not None:
                await delivery.first_pass.wait()

        async def logs_drained() -> None:
            with contextlib.suppress(Exception):
                await shipper[0]

        # The three waits side by side, not one after the other (ADR 0165): the outputs' first pass, every
        # metric file read to its end and shipped (bounded), every log line stored; the end is reported
        # after all three.
        await asyncio.gather(
            first_delivery(),
            self.collectors.drain(record, member_dir(self.paths, record.member_id)),
            logs_drained(),
        )
        _say(self.ctx, f"member {record.member_id}: {record.reason}")
        hold = float(self.ctx.extra.get("hold_exit_report") or 0)
        if hold > 0:
            _say(self.ctx, f"member {record.member_id}: holding the exit report {hold:g}s (test option)")
            await asyncio.sleep(hold)
        payload = record.unreported.get("member_exited") or {
            "member_id": record.member_id,
            "exit_code": record.exit_code,
            "reason": record.reason,
        }
        await self.report(record, "member_exited", payload)

    def _finish_later(self, record: MemberRecord) -> None:
        task = self.finishing.get(record.member_id)
        if task is None or task.done():
            self.finishing[record.member_id] = asyncio.get_running_loop().create_task(
                self.finish_end(record), name=f"end-{record.member_id}"
            )

    async def reap(self) -> None:
        """Wait for every child that ended (collectors draining after their member, retired runners)."""
        seen: set[int] = set()
        while True:
            # poll() waits for a child that ended; the collectors' own bookkeeping keeps its entries (it
            # reads their exit status when it restarts or drains them).
            tracked = [*self.collectors.processes.values(), *self.runners.values(), *self.standby.children()]
            for child in tracked:
                child.poll()
            self.retired = [child for child in self.retired if child.poll() is None]
            # A child nobody holds any more (a dropped handle) is waited for here, once it has been a
            # zombie for a whole interval (so a thread about to wait for its own child is never robbed).
            known = {child.pid for child in [*tracked, *self.retired]}
            zombies = await asyncio.to_thread(zombie_children, os.getpid())
            for pid in (zombies & seen) - known:
                with contextlib.suppress(ChildProcessError):
                    os.waitpid(pid, os.WNOHANG)
            seen = zombies - known
            await asyncio.sleep(REAP_INTERVAL)

    # ---- stop, kill ---------------------------------------------------------------------------------

    async def stop(self, member_id: int, reason: str, grace: float) -> dict:
        record = self.store.get(member_id)
        if record is None or record.state in ("preparing", "prepared", "failed"):
            # Never started here (or long forgotten): nothing to stop; say so so its resources can go.
            if record is not None:
                await self.abort(member_id, reason)
            await self.report(
                None,
                "member_exited",
                {
                    "member_id": member_id,
                    "exit_code": None,
                    "reason": f"never started on this node ({reason})",
                },
            )
            return {"member_id": member_id, "running": False}
        if record.state == "ended":
            await self.report(
                record,
                "member_exited",
                {"member_id": member_id, "exit_code": record.exit_code, "reason": record.reason},
            )
            return {"member_id": member_id, "running": False}
        pids = await asyncio.to_thread(self.processes_of, record)
        signal_all(pids, signal.SIGTERM)
        _say(
            self.ctx,
            f"member {member_id}: SIGTERM to {len(pids)} process(es) ({reason}); SIGKILL in {grace:g}s",
        )
        if member_id not in self.killers or self.killers[member_id].done():
            self.killers[member_id] = asyncio.get_running_loop().create_task(self._kill_after(record, grace))
        self.ensure_watcher(record)
        return {"member_id": member_id, "signalled": len(pids)}

    def processes_of(self, record: MemberRecord) -> set[int]:
        return self.member_pids(record.member_id, record)

    def member_pids(self, member_id: int, record: MemberRecord | None) -> set[int]:
        """Every process of the member that is alive: its runner (from the record, when there is one), the
        runner's descendants and session, everything carrying its tag, and the keeper named in its
        directory with the keeper's descendants."""
        pids = member_processes(
            record.pid if record else None,
            record.pid_started if record else None,
            member_tag(self.paths, member_id),
        )
        # The keeper's descendants too: after the runner was killed they are found by tag only, and a child
        # started with a clean environment (`env -i`) carries none; SIGKILLing the keeper before it would
        # leave that child running after the member's resources were released.
        keeper = read_runner_pids(member_dir(self.paths, member_id))
        if keeper.get("keeper") and alive(keeper["keeper"], keeper.get("keeper_started")):
            pids |= {keeper["keeper"]} | descendants(keeper["keeper"])
        pids.discard(os.getpid())
        return pids

    async def _kill_after(self, record: MemberRecord, grace: float) -> None:
        deadline = asyncio.get_running_loop().time() + grace
        while asyncio.get_running_loop().time() < deadline:
            if not await asyncio.to_thread(self.processes_of, record):
                return
            await asyncio.sleep(0.1)
        pids = await asyncio.to_thread(self.processes_of, record)
        if not pids:
            return
        _say(self.ctx, f"member {record.member_id}: grace over, SIGKILL to {len(pids)} process(es)")
        # The workload first, so the runner's keeper can still write its exit status; then the rest.
        directory = member_dir(self.paths, record.member_id)
        keeper = read_runner_pids(directory).get("keeper")
        signal_all(pids - {record.pid, keeper}, signal.SIGKILL)
        for _ in range(20):
            if not await asyncio.to_thread(member_lock_held, directory):
                return
            await asyncio.sleep(0.1)
        signal_all(await asyncio.to_thread(self.processes_of, record), signal.SIGKILL)

    async def kill(self, member_ids: list[int], reason: str) -> dict:
        killed = {}
        for member_id in member_ids:
            record = self.store.get(member_id)
            if record is not None and record.state == "running":
                # The acknowledgement of KILL is the control plane's proof that nothing of the member
                # runs any more (it releases what the member held): wait until its processes are gone.
                await self.stop(member_id, reason, grace=2.0)
                killer = self.killers.get(member_id)
                if killer is not None:
                    await asyncio.wait_for(asyncio.shield(killer), timeout=10.0)
                await self._kill_until_gone(member_id, record)
                killed[str(member_id)] = "killed"
                continue
            # Whatever the record says (none, preparing, failed, ended: a runner spawned but not yet
            # recorded, a keeper or a clean-environment child left behind), every process of the member is
            # SIGKILLed and the acknowledgement waits until none is left: it releases the member's GPUs.
            count = await self._kill_until_gone(member_id, record)
            killed[str(member_id)] = f"{count} process(es) killed"
            if record is None:
                await self.report(
                    None,
                    "member_exited",
                    {"member_id": member_id, "exit_code": None, "reason": f"killed: {reason}"},
                )
        _say(self.ctx, f"kill {member_ids}: {reason}")
        return {"killed": killed}

    async def _kill_until_gone(self, member_id: int, record: MemberRecord | None) -> int:
        """SIGKILL every process of the member until none is left; CommandFailed (the KILL is answered with
        an error, so nothing is released) when some survive KILL_WAIT seconds. Returns how many were found."""
        found: set[int] = set()
        deadline = asyncio.get_running_loop().time() + KILL_WAIT
        while pids := await asyncio.to_thread(self.member_pids, member_id, record):
            found |= pids
            if asyncio.get_running_loop().time() > deadline:
                raise CommandFailed(f"member {member_id}: {len(pids)} process(es) still alive after KILL")
            signal_all(pids, signal.SIGKILL)
            await asyncio.sleep(0.05)
        return len(found)

    # ---- reconcile ----------------------------------------------------------------------------------

    async def on_session(self) -> None:
        """A new control session: probe port, reconcile, then whatever is still unreported."""
        await self._report_probe()
        if self.reaper is None or self.reaper.done():
            self.reaper = asyncio.get_running_loop().create_task(self.reap(), name="reaper")
        running, exited = [], []
        for record in self.store.all():
            if record.state == "running":
                if await asyncio.to_thread(self.running_now, record):
                    running.append({"member_id": record.member_id, "pid": record.pid})
                    self.ensure_watcher(record)
                    continue
                # It ended (maybe while the agent was away): record its end now, so this reconcile
                # reports it with its exit status; delivery and the exit report go on in the background.
                if self.record_end(record):
                    self._finish_later(record)
            if record.state != "ended":
                continue
            # Outputs still pending after an agent restart: delivery resumes (an interrupted upload
            # continues from the chunks the server holds).
            self.ensure_delivery(record)
            if "member_exited" in record.unreported:
                exited.append(
                    {"member_id": record.member_id, "exit_code": record.exit_code, "reason": record.reason}
                )
            elif settled(record) and not self._busy(record.member_id):
                # Reported, acknowledged and delivered: nothing left to remember.
                self.store.forget(record.member_id)
                for tasks in (self.deliveries, self.finishing, self.watchers):
                    tasks.pop(record.member_id, None)
        running += await asyncio.to_thread(self._untracked_members, {r["member_id"] for r in running})
        self.publish()
        try:
            result = await self.send("reconcile", {"running": running, "exited": exited})
        except (ConnectionError, TimeoutError, RuntimeError, Refused) as exc:
            _say(self.ctx, f"reconcile not sent ({exc})")
            # No command reaches a session that has not reconciled: end it so the next one tries again.
            raise ConnectionError(f"reconcile not accepted: {exc}") from exc
        _say(
            self.ctx,
            f"reconciled: running {[r['member_id'] for r in running]}, ended "
            f"{[e['member_id'] for e in exited]}: {json.dumps(result)}",
        )
        for item in exited:
            record = self.store.get(item["member_id"])
            if record is not None:
                record.unreported.pop("member_exited", None)
                self.keep(record)
        for record in self.store.all():
            for kind, payload in list(record.unreported.items()):
                await self.report(record, kind, payload)
            task = self.prepares.get(record.member_id)
            if record.state == "preparing" and record.prepare_payload and (task is None or task.done()):
                _say(
                    self.ctx, f"member {record.member_id}: preparing again (the agent restarted mid-prepare)"
                )
                self._begin_prepare(record, record.prepare_payload)
        self.standby.fill()

    def _busy(self, member_id: int) -> bool:
        task = self.finishing.get(member_id)
        watcher = self.watchers.get(member_id)
        return (task is not None and not task.done()) or (watcher is not None and not watcher.done())

    def _untracked_members(self, known: set[int]) -> list[dict]:
        """Processes carrying one of this agent's member tags but without a record (a crash between spawn
        and record): reported as running so the control plane decides (keep or kill)."""
        suffix = "." + tag_suffix(self.paths)
        found: dict[int, int] = {}
        proc = Path("/proc")
        for entry in proc.iterdir():
            if not entry.name.isdigit():
                continue
            try:
                environ = (entry / "environ").read_bytes()
            except OSError:
                continue
            for item in environ.split(b"\0"):
                if item.startswith(TAG_VARIABLE.encode() + b"=m") and item.endswith(suffix.encode()):
                    with contextlib.suppress(ValueError):
                        member_id = int(item.split(b"=", 1)[1][1:].split(b".")[0])
                        if member_id not in known and self.store.get(member_id) is None:
                            found.setdefault(member_id, int(entry.name))
        return [{"member_id": m, "pid": p} for m, p in found.items()]

    async def _report_probe(self) -> None:
        options = self.ctx.extra.get("probe", {})
        if self.probe is None:
            self.probe = ProbeServer(options.get("host", "0.0.0.0"), options.get("port", 0))
            try:
                await self.probe.start()
            except OSError as exc:
                _say(
                    self.ctx,
                    f"peer-network probe could not listen ({exc}); peers will fail to reach this node",
                )
                self.probe = None
                return
            _say(self.ctx, f"peer-network probe listening on {self.probe.host}:{self.probe.port}")
        payload: dict[str, Any] = {"port": self.probe.port}
        if options.get("advertise_address"):
            payload["address"] = options["advertise_address"]
        with contextlib.suppress(ConnectionError, TimeoutError, RuntimeError, Refused):
            await self.send("probe", payload)


def launch_agent(ctx: AgentContext) -> LaunchAgent:
    agent = ctx.extra.get("launch")
    if agent is None:
        agent = ctx.extra["launch"] = LaunchAgent(ctx)
    return agent


@command("prepare")
async def prepare(ctx: AgentContext, payload: dict) -> dict:
    return launch_agent(ctx).accept_prepare(payload)


@command("start")
async def start(ctx: AgentContext, payload: dict) -> dict:
    return await launch_agent(ctx).start(int(payload["member_id"]), bool(payload.get("telemetry_token")))


@command("stop")
async def stop(ctx: AgentContext, payload: dict) -> dict:
    grace = float(payload.get("grace_seconds") or 10.0)
    return await launch_agent(ctx).stop(int(payload["member_id"]), payload.get("reason") or "stop", grace)


@command("abort")
async def abort(ctx: AgentContext, payload: dict) -> dict:
    return await launch_agent(ctx).abort(int(payload["member_id"]), payload.get("reason") or "launch aborted")


@command("kill")
async def kill(ctx: AgentContext, payload: dict) -> dict:
    ids = [int(m) for m in payload.get("member_ids") or []]
    return await launch_agent(ctx).kill(ids, payload.get("reason") or "kill")


async def reconcile_on_session(ctx: AgentContext) -> None:
    if ctx.paths is None:  # an agent context without directories (benchmarks) runs no members
        return
    await launch_agent(ctx).on_session()


SESSION_HOOKS.append(reconcile_on_session)
