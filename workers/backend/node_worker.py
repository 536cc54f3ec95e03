"""`tuneplane worker --backend node`: the pgqueuer consumer of `launch` jobs and the placement loop.

Launch (one pgqueuer job per attempt, enqueued by reserve_next in the reservation's transaction):
claim_launch takes the lease (a new fencing epoch), the capsule is built and stored under its digest,
and begin_prepare records it and sends PREPARE to every member's node in one transaction. A worker that
dies half-way leaves the pgqueuer job `picked`; pgqueuer hands it to another worker once its heartbeat is
older than --heartbeat-timeout, and that worker's claim fences the dead one off. Several workers may run.

Placement loop (in the same process): LISTEN on `tuneplane_placement` (capacity came free) and
`tuneplane_job_queued` (a confirmation), with a bounded poll as the fallback (the tables are the truth,
NOTIFY only a wake-up).
Each pass runs reserve_next for the node-backend fleets with queued jobs.

Sweeps (in the same process, on their own thread and connection): every sweep of TunePlane, scheduled by
workers.sweeps.Sweeper.

Team webhooks (workers/backend/webhook_delivery.py) are sent by a loop of their own in the same process,
woken by `tuneplane_team_events` on the same LISTEN connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import signal
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import psycopg
from pgqueuer import QueueManager
from pgqueuer.models import Job
from pgqueuer.queries import Queries

from tuneplane.app import db_functions as fn
from tuneplane.app import reconnect
from tuneplane.app.artifacts.s3_delivery import FleetStores
from tuneplane.app.blobstore import FilesystemBlobStore
from tuneplane.app.errors import Refusal
from tuneplane.app.node_gateway.aiodb import AsyncDatabase
from tuneplane.app.s3store import S3Store
from tuneplane.workers.backend import webhook_delivery
from tuneplane.workers.backend.capsule_build import build_capsule
from tuneplane.workers.capsule import CapsuleError
from tuneplane.workers.sweeps import Sweeper

log = logging.getLogger("tuneplane.worker")

CHANNELS = ("tuneplane_placement", "tuneplane_job_queued")
BACKEND = "node"
# Most jobs one reserve_next transaction places.
PASS_PLACEMENTS = 1000


@dataclass(frozen=True)
class WorkerOptions:
    database_url: str
    blob_dir: Path
    name: str
    poll_interval: float = 1.0
    # A launch of a worker that died is taken over by another within heartbeat_timeout + dequeue_every
    # (pgqueuer re-picks a picked job whose heartbeat, written every heartbeat_timeout / 2, is older).
    heartbeat_timeout: float = 10.0
    batch_size: int = 4
    # Tests only: wait this long between building the capsule and begin_prepare (a window to kill -9 in).
    hold_before_prepare: float = 0.0
    # Blob garbage collection (app/artifacts/gc.py, one of workers.sweeps): how often, and how old an
    # unreferenced blob must be.
    blob_gc_interval: float = 6 * 3600.0
    blob_gc_min_age: float = 3600.0


class NodeWorker:
    def __init__(self, options: WorkerOptions, *, say=print) -> None:
        self.options = options
        self.say = say
        self.db = AsyncDatabase(options.database_url, min_size=1, max_size=4, name="tuneplane-worker")
        self.blobs = FilesystemBlobStore(options.blob_dir)
        self.stores = FleetStores()  # S3 fleets' stores, with this worker's (the server's) credentials
        self.stop = asyncio.Event()
        self.wake = asyncio.Event()
        self.stats = {"launches": 0, "placements": 0, "passes": 0}
        # One launch task per attempt in this process: the direct launch after a placement pass and the
        # queued `launch` job for the same attempt share it, so the capsule is built once.
        self.launching: dict[int, asyncio.Task] = {}
        self.direct_launches: set[asyncio.Task] = set()
        self.sweeper = Sweeper(
            options.database_url,
            options.blob_dir,
            poll_interval=options.poll_interval,
            every={"blob_gc": options.blob_gc_interval},
            blob_gc_min_age=options.blob_gc_min_age,
            say=say,
        )
        self.webhooks = webhook_delivery.WebhookDeliverer(
            self.db, options.name, poll_interval=options.poll_interval, say=say
        )

    # ---- launch -------------------------------------------------------------------------------------

    async def launch_attempt(self, attempt_id: int) -> str:
        """Claim, build, begin_prepare, once per attempt at a time in this process: a second caller (the
        queued launch job while the direct launch runs, or the other way round) waits for the first and
        gets its answer instead of claiming and building again. Returns what happened."""
        task = self.launching.get(attempt_id)
        if task is None:
            task = asyncio.get_running_loop().create_task(
                self._claim_and_prepare(attempt_id), name=f"launch-{attempt_id}"
            )
            self.launching[attempt_id] = task
            task.add_done_callback(lambda _t: self.launching.pop(attempt_id, None))
        return await asyncio.shield(task)

    async def _capsule_store(self, attempt_id: int) -> S3Store | None:
        """The S3 store of the attempt's fleet, where its capsule goes (None: the server's own store). A
        worker without the store's credentials cannot write there: the launch is aborted, saying so."""
        storage = (await self.db.call(fn.attempt_storage, attempt_id))[0]["attempt_storage"]
        if storage is None:
            return None
        try:
            return await asyncio.to_thread(self.stores.store, storage)
        except Refusal as refusal:
            raise CapsuleError(f"the fleet's object store: {refusal.message}") from refusal

    async def _claim_and_prepare(self, attempt_id: int) -> str:
        claimed = await self.db.call(fn.claim_launch, attempt_id, self.options.name)
        if not claimed:
            return "nothing to do"
        claim = claimed[0]
        epoch = claim["epoch"]
        if claim["state"] != "reserved":
            return f"already {claim['state']}"
        row = await self.db.fetch_all("SELECT spec FROM jobs WHERE id = %s", (claim["job_id"],))
        spec = row[0]["spec"]
        try:
            store = await self._capsule_store(attempt_id)
            digest = await asyncio.to_thread(build_capsule, spec, self.blobs, store)
        except (CapsuleError, OSError) as exc:
            try:
                await self.db.call(fn.abort_launch, attempt_id, epoch, str(exc))
            except Refusal as refusal:
                return f"taken over ({refusal.message})"
            self.say(f"attempt {attempt_id} of job {claim['job_id']}: aborted, {exc}")
            return f"aborted: {exc}"
        if self.options.hold_before_prepare > 0:
            self.say(
                f"attempt {attempt_id}: capsule {digest} built; holding {self.options.hold_before_prepare}s"
            )
            await asyncio.sleep(self.options.hold_before_prepare)
        try:
            state = (await self.db.call_one(fn.begin_prepare, attempt_id, epoch, digest))["begin_prepare"]
        except Refusal as refusal:
            if refusal.status == 409:
                self.say(f"attempt {attempt_id}: {refusal.message}")
                return "taken over"
            raise
        self.stats["launches"] += 1
        self.say(f"attempt {attempt_id} of job {claim['job_id']}: capsule {digest}, {state} (epoch {epoch})")
        return state

    async def _on_launch_job(self, job: Job) -> None:
        try:
            attempt_id = int(json.loads(bytes(job.payload or b"{}"))["attempt_id"])
        except (ValueError, KeyError, TypeError):
            log.error("launch job %s has an unusable payload %r", job.id, job.payload)
            return
        await self.launch_attempt(attempt_id)

    # ---- placement ----------------------------------------------------------------------------------

    async def placement_pass(self) -> int:
        placed = 0
        for fleet in await self.db.call(fn.placement_fleets, BACKEND):
            # reserve_next walks the whole queue but places at most PASS_PLACEMENTS jobs per transaction
            # (short transactions); a pass that hit the bound is followed by another at once.
            while True:
                # A deadlock victim (the one cycle the lock order leaves: launch.sql's header) runs again.
                rows = await self.db.call_retrying(fn.reserve_next, fleet["fleet_id"], PASS_PLACEMENTS)
                for row in rows:
                    self._launch_now(row["attempt_id"])
                placed += len(rows)
                if len(rows) < PASS_PLACEMENTS:
                    break
        self.stats["placements"] += placed
        return placed

    def _launch_now(self, attempt_id: int) -> None:
        """Start the launch this pass just reserved without waiting for the queue to hand it over.

        The pgqueuer `launch` job enqueued with the reservation stays the durable path (it finishes the
        launch if this process dies); when it runs after this, claim_launch finds the attempt past
        `reserved` and it ends at once. Why: pgqueuer's psycopg driver shares one connection between
        its NOTIFY watcher and its dequeue, so a wake-up can sit behind a 1 s notifies() wait.
        """
        task = asyncio.get_running_loop().create_task(
            self._launch_quietly(attempt_id), name=f"direct-launch-{attempt_id}"
        )
        self.direct_launches.add(task)
        task.add_done_callback(self.direct_launches.discard)

    async def _launch_quietly(self, attempt_id: int) -> None:
        try:
            await self.launch_attempt(attempt_id)
        except (psycopg.Error, OSError, Refusal) as exc:
            log.warning(
                "direct launch of attempt %s failed (%s); the queued launch job will retry", attempt_id, exc
            )

    async def _listen(self) -> None:
        def on_notify(notify: psycopg.Notify) -> None:
            (self.webhooks.wake if notify.channel == webhook_delivery.CHANNEL else self.wake).set()

        def on_listening() -> None:
            self.wake.set()  # whatever happened while we were not listening
            self.webhooks.wake.set()

        await reconnect.listen_forever(
            self.db.listen_connection,
            (*CHANNELS, webhook_delivery.CHANNEL),
            on_notify,
            on_listening,
            stop=self.stop,
            name="node worker",
        )

    async def _schedule(self) -> None:
        while not self.stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.wake.wait(), self.options.poll_interval)
            self.wake.clear()
            try:
                await self.placement_pass()
                self.stats["passes"] += 1
            except (psycopg.Error, OSError) as exc:
                log.warning("placement pass failed: %s", exc)
                await asyncio.sleep(self.options.poll_interval)
            except Refusal as refusal:
                log.warning("placement pass refused: %s", refusal.message)

    # ---- the process --------------------------------------------------------------------------------

    async def _consume(self) -> None:
        """pgqueuer's consumer, started again on a new connection (the new primary after a failover) when
        its connection breaks; a job it had picked is picked again by pgqueuer's heartbeat timeout, and
        claim_launch makes a second run of a launch a no-op (never a second START)."""
        pauses = reconnect.backoff()
        while not self.stop.is_set():
            try:
                await self._consume_once()
                return
            except (psycopg.Error, OSError) as exc:
                if not reconnect.needs_reconnect(exc) and not isinstance(exc, OSError):
                    raise
                pause = next(pauses)
                log.warning("queue consumer lost its connection (%s); reconnecting in %.2fs", exc, pause)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.stop.wait(), pause)

    async def _consume_once(self) -> None:
        conn = await psycopg.AsyncConnection.connect(
            self.options.database_url, autocommit=True, application_name="tuneplane-worker-queue"
        )
        async with conn:
            qm = QueueManager(Queries.from_psycopg_connection(conn))
            qm.entrypoint("launch")(self._on_launch_job)
            stopper = asyncio.create_task(self._forward_stop(qm))
            try:
                await qm.run(
                    dequeue_timeout=timedelta(seconds=max(self.options.poll_interval, 0.5)),
                    batch_size=self.options.batch_size,
                    heartbeat_timeout=timedelta(seconds=self.options.heartbeat_timeout),
                    log_aggregation_interval=timedelta(0),
                )
            finally:
                stopper.cancel()

    async def _forward_stop(self, qm: QueueManager) -> None:
        await self.stop.wait()
        qm.shutdown.set()

    async def run(self) -> None:
        await self.db.open()
        tasks = [
            asyncio.create_task(self._listen(), name="listen"),
            asyncio.create_task(self._schedule(), name="schedule"),
            asyncio.create_task(self._consume(), name="consume"),
            asyncio.create_task(self.webhooks.run(self.stop), name="webhooks"),
        ]
        self.sweeper.start()
        self.say(
            f"worker {self.options.name} (backend {BACKEND}) consuming `launch`; placement loop every "
            f"{self.options.poll_interval}s or on NOTIFY"
        )
        try:
            done, _pending = await asyncio.wait(
                [*tasks, asyncio.create_task(self.stop.wait())], return_when=asyncio.FIRST_COMPLETED
            )
            for task in done:
                if task in tasks and task.exception() is not None:
                    raise task.exception()  # type: ignore[misc]
        finally:
            self.stop.set()
            consume = tasks[2]
            with contextlib.suppress(TimeoutError, Exception):
                await asyncio.wait_for(asyncio.shield(consume), 10)
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await asyncio.to_thread(self.sweeper.close)
            await self.db.close()


def main(options: WorkerOptions) -> None:
    async def runner() -> None:
        worker = NodeWorker(options, say=lambda line: print(line, flush=True))
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(NotImplementedError):
                loop.add_signal_handler(sig, worker.stop.set)
        await worker.run()

    asyncio.run(runner())
