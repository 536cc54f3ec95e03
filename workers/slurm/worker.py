"""`tuneplane worker --backend slurm`: drives every Slurm fleet through Slurm's command-line tools.

One loop (every poll interval, or at once on NOTIFY `tuneplane_job_queued` / `tuneplane_placement`), per
Slurm fleet:
  1. look at the cluster (sinfo, scontrol show partition) → slurm_sync_fleet; a controller that does not
     answer → slurm_controller_unreachable (members contact-lost, nothing else decided), and the pass ends;
  2. queued jobs without a live attempt → slurm_submissions_due → capsule on the shared path, batch script,
     `sbatch` → slurm_submitted;
  3. follow what Slurm lists (one squeue): pending → slurm_pending (reason, jobs ahead); the allocation
     started → slurm_allocation_started and plan.json for the steps; the steps' report files → the
     slurm_member_* functions; the launch decision → the `decision` file the batch script waits for; a job
     that left squeue → its end state (scontrol) → slurm_member_exited for runners that wrote their exit
     status, then slurm_job_ended;
  4. slurm_scancel_due → scancel (SIGTERM to every step, the launch settings' stop grace, then scancel).
Between passes the launch path does not wait for one (ADR 0165): the batch script and the job steps write
their reports by renaming a file into the attempt's `reports/`, inotify wakes this process, and it handles
only the attempts whose reports moved (a targeted `squeue -j` for an allocation, then the reports). The
pass stays the fallback for what no event announces (a shared filesystem that raises none, a job that left
squeue, a pending reason).
Every decision is a stored function (sql/functions/slurm.sql); this process only reads Slurm and files.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import psycopg

from tuneplane.app import db_functions as fn
from tuneplane.app import reconnect
from tuneplane.app.blobstore import FilesystemBlobStore
from tuneplane.app.db import Database
from tuneplane.app.errors import Refusal
from tuneplane.app.security import new_token
from tuneplane.app.telemetry.tokens import TOKEN_PREFIX as TELEMETRY_TOKEN_PREFIX
from tuneplane.workers import sweeps
from tuneplane.workers.backend.capsule_build import build_capsule
from tuneplane.workers.capsule import CapsuleError
from tuneplane.workers.slurm.cli import (
    ControllerUnreachable,
    QueuedJob,
    SlurmCli,
    SlurmError,
    UnsupportedSlurm,
)
from tuneplane.workers.slurm.watch import ReportWatch

log = logging.getLogger("tuneplane.worker.slurm")
BACKEND = "slurm"
# Largest piece of a member's log per call (the node agent's chunk size).
LOG_CHUNK_BYTES = 64 * 1024
CHANNELS = ("tuneplane_placement", "tuneplane_job_queued")
LIVE_SLURM_STATES = {
    "PENDING",
    "CONFIGURING",
    "RUNNING",
    "COMPLETING",
    "SUSPENDED",
    "REQUEUED",
    "RESIZING",
    "STAGE_OUT",
    "SIGNALING",
    "REQUEUE_HOLD",
    "REQUEUE_FED",
    "RESV_DEL_HOLD",
    "STOPPED",
}


@dataclass(frozen=True)
class SlurmWorkerOptions:
    database_url: str
    blob_dir: Path
    name: str
    poll_interval: float = 1.0
    # Seconds an attempt may wait for its sbatch answer to be recorded before a missing Slurm job aborts it.
    submit_grace: float = 30.0
    # Extra environment for the batch script (tests: the prepare-failure hook).
    batch_env: dict = field(default_factory=dict)


@dataclass
class FleetState:
    fleet_id: int
    name: str
    cli: SlurmCli
    partition: str
    account: str | None
    qos: str | None
    shared: Path
    # Where the nodes reach the telemetry gateway (capabilities.telemetry_url); None: no collectors.
    telemetry_url: str | None = None
    version: str = ""
    # (attempt_id, rank, kind) already turned into a call
    done: set = field(default_factory=set)
    # (attempt_id, rank, stream) → the next byte of that log to ship
    log_offsets: dict = field(default_factory=dict)
    # attempt_id → monotonic time of the SIGTERM scancel (the final scancel follows after the grace)
    terminating: dict = field(default_factory=dict)
    # The last pass found the controller unreachable: nothing is decided for this fleet until one reaches it
    # (reports wait in their files; the pass reads them all then).
    unreachable: bool = False


class SlurmWorker:
    def __init__(self, options: SlurmWorkerOptions, *, say=print) -> None:
        self.options = options
        self.say = say
        self.db = Database(options.database_url, max_size=3, name="tuneplane-worker-slurm")
        self.blobs = FilesystemBlobStore(options.blob_dir)
        # The sweeps this worker runs itself (it may run without a node worker), on their own thread.
        self.sweeper = sweeps.Sweeper(
            options.database_url,
            options.blob_dir,
            poll_interval=options.poll_interval,
            say=say,
            schedule=sweeps.SLURM_SCHEDULE,
        )
        self.stop = threading.Event()
        self.wake = threading.Event()
        # Set by NOTIFY (a confirmation, capacity came free): the next loop runs a whole pass at once.
        self.notified = threading.Event()
        # (fleet id, attempt id) whose reports directory changed since the last look (inotify).
        self.touched: set[tuple[int, int]] = set()
        self.touched_lock = threading.Lock()
        self.watch = ReportWatch(self.touch)
        self.fleets: dict[int, FleetState] = {}
        self.credentials: dict[int, str] = {}  # node id → credential hash (deliver_outputs)

    # ---- fleets -------------------------------------------------------------------------------------

    def load_fleets(self) -> list[FleetState]:
        rows = self.db.fetch_all(
            "SELECT f.id, f.name, f.capabilities, s.slurm_conf, s.partition, s.account, s.qos"
            "  FROM tuneplane.fleets f JOIN tuneplane.slurm_fleets s ON s.fleet_id = f.id"
            " WHERE f.backend = 'slurm' ORDER BY f.id"
        )
        for row in rows:
            if row["id"] in self.fleets:
                continue
            state = FleetState(
                fleet_id=row["id"],
                name=row["name"],
                cli=SlurmCli(row["slurm_conf"]),
                partition=row["partition"],
                account=row["account"],
                qos=row["qos"],
                shared=Path(row["capabilities"]["shared_path"]),
                telemetry_url=row["capabilities"].get("telemetry_url"),
            )
            try:
                state.version = state.cli.version()
            except UnsupportedSlurm as exc:
                self.say(f"fleet {row['name']}: refused: {exc}")
                raise
            except SlurmError as exc:
                self.say(f"fleet {row['name']}: cannot read the Slurm version yet ({exc})")
                continue
            self.say(f"fleet {row['name']}: Slurm {state.version}, partition {state.partition}")
            self.fleets[row["id"]] = state
        return list(self.fleets.values())

    def call(self, function: str, *args):
        return self.db.call(function, *args)

    # ---- events -------------------------------------------------------------------------------------

    def touch(self, key: tuple[int, int]) -> None:
        """A report was renamed into an attempt's reports/ (the watch's thread)."""
        with self.touched_lock:
            self.touched.add(key)
        self.wake.set()

    def take_touched(self) -> set[tuple[int, int]]:
        with self.touched_lock:
            touched, self.touched = self.touched, set()
        return touched

    def watch_attempt(self, fleet: FleetState, attempt_id: int) -> None:
        reports = self.attempt_dir(fleet, attempt_id) / "reports"
        if reports.is_dir():
            self.watch.add(reports, (fleet.fleet_id, attempt_id))

    def run_touched(self, touched: set[tuple[int, int]]) -> None:
        """Only the attempts whose reports moved: an allocation (read from Slurm for that job alone), then
        their reports. Nothing here concludes that a job ended: that stays the pass's (squeue, scontrol)."""
        for fleet_id in {fleet_id for fleet_id, _ in touched}:
            fleet = self.fleets.get(fleet_id)
            if fleet is None or fleet.unreachable:
                continue
            wanted = {attempt_id for f, attempt_id in touched if f == fleet_id}
            rows = [r for r in self.call(fn.slurm_followed, fleet_id) if r["attempt_id"] in wanted]
            allocating = [
                r["slurm_job_id"] for r in rows if r["attempt_state"] == "reserved" and r["slurm_job_id"]
            ]
            try:
                queue = fleet.cli.queue(only=allocating) if allocating else {}
            except ControllerUnreachable:
                continue  # the pass marks it
            for row in rows:
                if row["slurm_job_id"] is None:
                    continue
                directory = self.attempt_dir(fleet, row["attempt_id"])
                queued = queue.get(row["slurm_job_id"])
                if (
                    queued is not None
                    and row["attempt_state"] == "reserved"
                    and queued.state != "PENDING"
                    and queued.node_list
                ):
                    self.allocation_started(fleet, row, queued, directory)
                    row = {**row, "attempt_state": "preparing"}
                self.read_reports(fleet, row, directory, final_state=None)

    # ---- one pass -----------------------------------------------------------------------------------

    def run_pass(self) -> None:
        for fleet in self.load_fleets():
            try:
                self.fleet_pass(fleet)
                fleet.unreachable = False
            except ControllerUnreachable as exc:
                fleet.unreachable = True
                marked = self.call(fn.slurm_controller_unreachable, fleet.fleet_id, str(exc))[0]
                count = marked["slurm_controller_unreachable"]
                self.say(
                    f"fleet {fleet.name}: controller unreachable ({exc}); {count} member(s) contact-lost"
                )

    def fleet_pass(self, fleet: FleetState) -> None:
        # Confirmed jobs go to sbatch first: the cluster's description below changes nothing for them (the
        # preview already checked them against it) and a confirmation's NOTIFY should not wait for it.
        for due in self.call(fn.slurm_submissions_due, fleet.fleet_id):
            self.submit(fleet, due)
        limits = fleet.cli.partition_limits(fleet.partition)
        nodes = fleet.cli.nodes(fleet.partition)
        status = {
            "version": fleet.version,
            "partition": limits,
            "nodes": [node.__dict__ for node in nodes],
        }
        self.call(fn.slurm_sync_fleet, fleet.fleet_id, json.dumps(status))
        queue = fleet.cli.queue()
        for row in self.call(fn.slurm_followed, fleet.fleet_id):
            self.follow(fleet, row, queue)
        self.deliver_preemptions(fleet)
        # A grace that ended stopped its attempt (expire_grace_deadlines, run by this worker's sweeper and
        # every node worker's): cancel its Slurm job.
        for row in self.call(fn.slurm_scancel_due, fleet.fleet_id):
            queued = queue.get(row["slurm_job_id"])
            running = queued is not None and queued.state != "PENDING"
            fleet.cli.cancel(row["slurm_job_id"], running=running)
            if running:
                fleet.terminating[row["attempt_id"]] = time.monotonic()
            self.say(f"attempt {row['attempt_id']}: scancel Slurm job {row['slurm_job_id']} ({row['why']})")
        grace = self.stop_grace()
        for attempt_id, since in list(fleet.terminating.items()):
            if time.monotonic() - since >= grace:
                job = self.db.fetch_one(
                    "SELECT slurm_job_id FROM tuneplane.slurm_jobs WHERE attempt_id = %s", (attempt_id,)
                )
                fleet.terminating.pop(attempt_id)
                if job and job["slurm_job_id"] in queue:
                    fleet.cli.run("scancel", str(job["slurm_job_id"]))

    def deliver_preemptions(self, fleet: FleetState) -> None:
        """Attempts asked to checkpoint and stop (request_preemption): the request file in each member's
        output directory (the node agent's own writer: .tuneplane/preempt.json, which the SDK reads), then the
        job's signal to its steps (`scancel --signal`, never to the batch script), recorded once."""
        from tuneplane.workers.agent.preemption import write_request

        for row in self.call(fn.slurm_preemptions_due, fleet.fleet_id):
            request = row["request"]
            files = 0
            for member in sorted((self.attempt_dir(fleet, row["attempt_id"]) / "members").glob("*")):
                try:
                    if (member / "output").is_dir():
                        write_request(member, request)
                        files += 1
                except OSError as exc:  # the signal still goes out: a trapped signal is enough for the SDK
                    self.say(f"attempt {row['attempt_id']}: the request file in {member} not written: {exc}")
            try:
                fleet.cli.signal_steps(row["slurm_job_id"], request["signal"])
            except ControllerUnreachable:
                raise
            except SlurmError as exc:  # gone meanwhile (follow records its end) or refused: next pass
                self.say(f"attempt {row['attempt_id']}: scancel --signal failed: {exc}")
                continue
            self.call(fn.slurm_preemption_signalled, row["attempt_id"], request["signal"], files)
            self.say(
                f"attempt {row['attempt_id']}: asked to checkpoint and stop ({request['reason']}); "
                f"{request['signal']} to the steps of Slurm job {row['slurm_job_id']}"
            )

    def stop_grace(self) -> float:
        row = self.db.fetch_one(
            "SELECT extract(epoch FROM stop_grace)::float AS s FROM tuneplane.launch_settings"
        )
        return float(row["s"]) if row else 10.0

    # ---- submit -------------------------------------------------------------------------------------

    def attempt_dir(self, fleet: FleetState, attempt_id: int) -> Path:
        return fleet.shared / "attempts" / str(attempt_id)

    def submit(self, fleet: FleetState, due: dict) -> None:
        attempt_id = due["attempt_id"]
        directory = self.attempt_dir(fleet, attempt_id)
        directory.mkdir(parents=True, exist_ok=True)
        try:
            digest = build_capsule(due["spec"], self.blobs)
            capsules = fleet.shared / "capsules"
            capsules.mkdir(parents=True, exist_ok=True)
            target = capsules / f"{digest}.tar"
            if not target.is_file():
                partial = capsules / f".{digest}.{os.getpid()}.partial"
                shutil.copyfile(self.blobs.path(digest), partial)
                os.replace(partial, target)
        except (CapsuleError, OSError) as exc:
            self.call(fn.decide_abort, attempt_id, f"the capsule could not be built: {exc}")
            return
        (directory / "capsule_digest").write_text(digest)
        (directory / "reports").mkdir(exist_ok=True)
        self.watch_attempt(fleet, attempt_id)
        script = batch_script(fleet, due, directory, self.options.batch_env)
        (directory / "batch.sh").write_text(script)
        try:
            slurm_job_id = fleet.cli.submit(script)
        except ControllerUnreachable:
            raise
        except SlurmError as exc:
            self.call(fn.decide_abort, attempt_id, f"sbatch refused the job: {exc}")
            self.say(f"attempt {attempt_id}: sbatch refused it: {exc}")
            return
        self.call(fn.slurm_submitted, attempt_id, slurm_job_id)
        self.say(f"attempt {attempt_id} of job {due['job_id']}: Slurm job {slurm_job_id}")

    # ---- follow -------------------------------------------------------------------------------------

    def follow(self, fleet: FleetState, row: dict, queue: dict[int, QueuedJob]) -> None:
        attempt_id = row["attempt_id"]
        slurm_job_id = row["slurm_job_id"]
        if slurm_job_id is None:
            self.recover_submission(fleet, row, queue)
            return
        directory = self.attempt_dir(fleet, attempt_id)
        self.watch_attempt(fleet, attempt_id)  # a restarted worker watches what it follows
        queued = queue.get(slurm_job_id)
        if queued is not None and queued.state == "PENDING":
            ahead = sum(
                1
                for other in queue.values()
                if other.state == "PENDING"
                and other.partition == queued.partition
                and (other.priority, -other.slurm_job_id) > (queued.priority, -slurm_job_id)
            )
            if row["attempt_state"] == "reserved":
                self.call(fn.slurm_pending, attempt_id, queued.reason, ahead)
            return
        if queued is not None and row["attempt_state"] == "reserved" and queued.node_list:
            self.allocation_started(fleet, row, queued, directory)
        self.read_reports(fleet, row, directory, final_state=None)
        if queued is None:
            state, detail = fleet.cli.job_end(slurm_job_id)
            self.read_reports(fleet, row, directory, final_state=state)
            result = self.call(fn.slurm_job_ended, attempt_id, state, detail)[0]["slurm_job_ended"]
            fleet.terminating.pop(attempt_id, None)
            self.watch.remove(directory / "reports")
            self.say(f"attempt {attempt_id}: Slurm job {slurm_job_id} ended {state}; attempt {result}")

    def recover_submission(self, fleet: FleetState, row: dict, queue: dict[int, QueuedJob]) -> None:
        """An attempt whose sbatch answer was never recorded (a worker stopped between sbatch and
        slurm_submitted): the Slurm job named after the attempt is adopted; when Slurm has none after
        submit_grace seconds, the sbatch never happened and the attempt is aborted (the job is retried by
        its max_attempts)."""
        name = job_name(row["attempt_id"])
        found = [job for job in queue.values() if job.name == name]
        if found:
            self.call(fn.slurm_submitted, row["attempt_id"], found[0].slurm_job_id)
            self.say(f"attempt {row['attempt_id']}: adopted Slurm job {found[0].slurm_job_id} ({name})")
        elif row["age_s"] > self.options.submit_grace:
            detail = f"sbatch was never answered and Slurm has no job named {name}"
            result = self.call(fn.slurm_job_ended, row["attempt_id"], "NEVER_SUBMITTED", detail)[0]
            self.say(f"attempt {row['attempt_id']}: {detail}; attempt {result['slurm_job_ended']}")

    def allocation_started(self, fleet: FleetState, row: dict, queued: QueuedJob, directory: Path) -> None:
        nodes = fleet.cli.hostnames(queued.node_list)
        digest = (directory / "capsule_digest").read_text().strip()
        port = 29500 + (row["job_id"] * 31 + row["attempt_number"]) % 2000
        members = self.call(fn.slurm_allocation_started, row["attempt_id"], nodes, port, digest)
        attempt = self.db.fetch_one(
            "SELECT a.master_addr, a.master_port, a.number, j.gpus_per_node FROM tuneplane.attempts a"
            "  JOIN tuneplane.jobs j ON j.id = a.job_id WHERE a.id = %s",
            (row["attempt_id"],),
        )
        job = self.db.fetch_one(
            "SELECT cpus_per_node, memory_per_node FROM tuneplane.jobs WHERE id = %s", (row["job_id"],)
        )
        plan = {
            "attempt_id": row["attempt_id"],
            "attempt": attempt["number"],
            "job_id": row["job_id"],
            "world_size": len(members),
            "capsule_digest": digest,
            "capsule_tar": str(fleet.shared / "capsules" / f"{digest}.tar"),
            "master_addr": attempt["master_addr"],
            "master_port": attempt["master_port"],
            "shared_path": str(fleet.shared),
            "telemetry_url": fleet.telemetry_url,
            "members": [
                {
                    "member_id": m["member_id"],
                    "rank": m["rank"],
                    "node": m["node"],
                    "gpu_indices": list(range(attempt["gpus_per_node"])),
                    "cpus": job["cpus_per_node"],
                    "memory_bytes": job["memory_per_node"],
                    # Checkpoint names numbered on from the job's earlier attempts (publish_each).
                    "checkpoint_numbers": self.call(fn.checkpoint_numbers, row["job_id"], m["rank"])[0][
                        "checkpoint_numbers"
                    ],
                }
                for m in members
            ],
        }
        resume = self.call(fn.resume_pin, row["attempt_id"])[0]["resume_pin"]
        if resume:
            # The checkpoint this attempt resumes from (chosen by slurm_allocation_started): each step copies
            # it from the shared path into its member's resume/ and verifies it against this manifest.
            plan["resume"] = resume
            plan["resume_manifest"] = self.db.fetch_one(
                "SELECT manifest FROM tuneplane.artifacts WHERE id = %s", (resume["artifact_id"],)
            )["manifest"]
        tmp = directory / "plan.json.tmp"
        tmp.write_text(json.dumps(plan, indent=2))
        os.replace(tmp, directory / "plan.json")
        self.say(f"attempt {row['attempt_id']}: allocation on {','.join(nodes)}; preparing")

    def read_reports(self, fleet: FleetState, row: dict, directory: Path, final_state: str | None) -> None:
        attempt_id = row["attempt_id"]
        reports = directory / "reports"
        plan_file = directory / "plan.json"
        if not plan_file.is_file():
            return
        world = len(json.loads(plan_file.read_text())["members"])
        for rank in range(world):
            self.report_once(
                fleet,
                attempt_id,
                rank,
                "prepared",
                reports,
                lambda r, _b: self.call(fn.slurm_member_prepared, attempt_id, r),
            )
            self.report_once(
                fleet,
                attempt_id,
                rank,
                "prepare_failed",
                reports,
                lambda r, b: self.call(fn.slurm_member_prepare_failed, attempt_id, r, b["reason"]),
            )
            self.report_once(
                fleet,
                attempt_id,
                rank,
                "started",
                reports,
                lambda r, b: self.call(fn.slurm_member_started, attempt_id, r, b["pid"]),
            )
        decision = self.db.fetch_one(
            "SELECT decision FROM tuneplane.launch_decisions WHERE attempt_id = %s", (attempt_id,)
        )
        if decision and not (directory / "decision").exists():
            if decision["decision"] == "commit":
                self.issue_telemetry_tokens(fleet, row, directory, world)
            tmp = directory / "decision.tmp"
            tmp.write_text(decision["decision"])
            os.replace(tmp, directory / "decision")
        for rank in range(world):
            self.ship_logs(fleet, attempt_id, rank, directory / "members" / str(rank) / "logs", final=False)
            if (attempt_id, rank, "started") in fleet.done and (attempt_id, rank, "exited") not in fleet.done:
                self.publish_checkpoints(directory / "members" / str(rank), final=False)
        for rank in range(world):
            key = (attempt_id, rank, "exited")
            if key in fleet.done:
                continue
            status_file = directory / "members" / str(rank) / "exit_status.json"
            if not status_file.is_file():
                continue
            signalled = (reports / f"{rank}.signalled").is_file()
            if signalled and final_state is None:
                continue  # wait for Slurm's end state: it says why the signal came (preempted, timeout …)
            # Every line the member wrote is stored, and every checkpoint it published registered, before
            # its end is recorded (as the node agent drains): the attempt's end names its last checkpoint.
            self.ship_logs(fleet, attempt_id, rank, directory / "members" / str(rank) / "logs", final=True)
            self.publish_checkpoints(directory / "members" / str(rank), final=True)
            status = json.loads(status_file.read_text())
            self.call(
                fn.slurm_member_exited,
                attempt_id,
                rank,
                status.get("exit_code"),
                status.get("reason"),
                signalled,
                final_state,
                signalled_at(reports / f"{rank}.signalled") if signalled else None,
            )
            if status.get("exit_code") == 0 and not signalled:
                self.deliver_outputs(attempt_id, rank, directory / "members" / str(rank))
            fleet.done.add(key)

    def ship_logs(self, fleet: FleetState, attempt_id: int, rank: int, logs: Path, final: bool) -> None:
        """New pieces of the member's stdout/stderr (on the shared path) into member_log_chunks, for
        `tuneplane jobs logs` and the job page; `final` also ships an incomplete last character."""
        from tuneplane.workers.agent.logship import STREAMS, decode_chunk, read_piece

        for stream in STREAMS:
            key = (attempt_id, rank, stream)
            path = logs / f"{stream}.log"
            while True:
                offset = fleet.log_offsets.get(key, 0)
                piece = read_piece(path, offset, LOG_CHUNK_BYTES, final)
                if not piece:
                    break
                payload = {
                    "stream": stream,
                    "offset": offset,
                    "length": len(piece),
                    "text": decode_chunk(piece),
                }
                answer = self.call(fn.slurm_member_log, attempt_id, rank, json.dumps(payload))[0]
                fleet.log_offsets[key] = int(answer["slurm_member_log"]["next_offset"])

    def deliver_outputs(self, attempt_id: int, rank: int, member_dir: Path) -> None:
        """A member that exited 0: each output the spec asks for becomes an artifact delivered `shared` where
        it already is (its output directory on the shared path); the receiver verifies every file there
        against the manifest before the artifact is complete."""
        from tuneplane.workers.agent.outputs import planned_outputs
        from tuneplane.workers.artifacts.manifest import ManifestError

        outputs = planned_outputs(member_dir)
        if not outputs:
            return
        member = self.db.fetch_one(
            "SELECT id FROM tuneplane.members WHERE attempt_id = %s AND rank = %s", (attempt_id, rank)
        )
        for output in outputs:
            root = member_dir / "output" / output["path"]
            try:
                artifact = self.register_shared(member["id"], output["name"], "output", root)
            except (ManifestError, OSError, Refusal) as exc:
                self.say(f"attempt {attempt_id} rank {rank}: output {output['name']} not delivered: {exc}")
                continue
            self.say(f"attempt {attempt_id} rank {rank}: output {output['name']} {artifact['state']}")

    def publish_checkpoints(self, member_dir: Path, final: bool) -> None:
        """Checkpoints the member published while it runs (sdk.checkpoint's request files and
        `.tuneplane-complete` markers: the node agent's rules, workers/agent/checkpoints.py), each registered
        `shared` where it lies and verified there by the receiver; its result file answers the SDK."""
        from tuneplane.workers.agent.checkpoints import publish_each

        if not (member_dir / "member.json").is_file():
            return
        try:
            publish_each(member_dir, self.say, self.register_checkpoint, final=final)
        except (OSError, ValueError) as exc:  # a half-written file: the next pass looks again
            self.say(f"{member_dir}: checkpoint scan failed: {exc}")

    def register_checkpoint(self, member_id: int, name: str, root: Path, step: int | None = None) -> dict:
        from tuneplane.workers.artifacts.manifest import ManifestError

        try:
            return self.register_shared(member_id, name, "checkpoint", root, step=step)
        except ManifestError as exc:
            return {"id": None, "state": "failed", "reason": f"not a readable checkpoint: {exc}"}
        except Refusal as exc:
            return {"id": None, "state": "failed", "reason": exc.message}

    def register_shared(
        self, member_id: int, name: str, kind: str, root: Path, *, step: int | None = None
    ) -> dict:
        """One artifact of the member delivered `shared` at `root` (on the shared path), as the member's node
        (its credential); the receiver verifies every file there against the manifest. `step`: a
        checkpoint's training step, as the workload said it."""
        from tuneplane.app.artifacts.receiver import ArtifactReceiver, Registration
        from tuneplane.workers.artifacts.manifest import build_manifest

        root = Path(os.path.normpath(root))
        manifest = build_manifest(root)
        node = self.db.fetch_one("SELECT node_id FROM tuneplane.members WHERE id = %s", (member_id,))
        receiver = ArtifactReceiver(self.db, self.options.blob_dir)
        return receiver.register(
            self.node_credential(node["node_id"]),
            Registration(
                member_id=member_id, name=name, manifest=manifest.as_json(), manifest_digest=manifest.digest,
                kind=kind, delivery="shared", shared_path=str(root), step=step,
            ),
        )  # fmt: skip

    def node_credential(self, node_id: int) -> str:
        """This worker's credential hash for a Slurm node (made once per node and process)."""
        if node_id not in self.credentials:
            _plaintext, digest = new_token("tpn")
            self.call(fn.slurm_node_credential, node_id, digest)
            self.credentials[node_id] = digest
        return self.credentials[node_id]

    def issue_telemetry_tokens(self, fleet: FleetState, row: dict, directory: Path, world: int) -> None:
        """One token per member, scoped to its telemetry only (only its hash is stored), in the member
        directory (0600) for the step's collector; issued at COMMIT, before the workload step may start."""
        if not fleet.telemetry_url:
            return
        for rank in range(world):
            target = directory / "members" / str(rank) / "telemetry.token"
            if target.exists():
                continue
            plaintext, digest = new_token(TELEMETRY_TOKEN_PREFIX)
            self.call(fn.issue_telemetry_token, row["job_id"], row["attempt_number"], rank, digest)
            fd = os.open(f"{target}.tmp", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w") as handle:
                handle.write(plaintext)
            os.replace(f"{target}.tmp", target)

    def report_once(
        self, fleet: FleetState, attempt_id: int, rank: int, kind: str, reports: Path, call
    ) -> None:
        key = (attempt_id, rank, kind)
        path = reports / f"{rank}.{kind}"
        if key in fleet.done or not path.is_file():
            return
        call(rank, json.loads(path.read_text()))
        fleet.done.add(key)

    # ---- the process --------------------------------------------------------------------------------

    def listen(self) -> None:
        def on_notify(_notify: psycopg.Notify) -> None:
            self.ask_for_pass()

        reconnect.listen_forever_sync(
            # Named like the node worker's, so that an operator (and the failover test) sees it listening.
            lambda: psycopg.connect(
                self.options.database_url, autocommit=True, application_name="tuneplane-slurm-worker-listen"
            ),
            CHANNELS,
            on_notify,
            # One pass after (re)connecting: what a NOTIFY missed meanwhile (a failover) would have said.
            self.ask_for_pass,
            stop=self.stop,
            name="slurm worker",
        )

    def ask_for_pass(self) -> None:
        """A pass now, not at the next poll (a plain wake runs only the touched attempts)."""
        self.notified.set()
        self.wake.set()

    def guarded(self, work, *args) -> None:
        try:
            work(*args)
        except (psycopg.Error, OSError, SlurmError) as exc:
            if isinstance(exc, UnsupportedSlurm):
                raise
            log.warning("slurm pass failed: %s", exc)
            self.say(f"pass failed: {exc}")
        except Refusal as refusal:
            self.say(f"pass refused: {refusal.message}")

    def run(self) -> None:
        threading.Thread(target=self.listen, name="listen", daemon=True).start()
        self.watch.start()
        self.sweeper.start()
        events = "NOTIFY and report files" if self.watch.available else "NOTIFY"
        self.say(
            f"worker {self.options.name} (backend {BACKEND}) every {self.options.poll_interval}s or on "
            + events
        )
        next_pass = 0.0
        try:
            while not self.stop.is_set():
                # Cleared before looking, so an event that arrives while we work wakes the wait below.
                self.wake.clear()
                touched = self.take_touched()
                if self.notified.is_set() or time.monotonic() >= next_pass:
                    self.notified.clear()
                    self.guarded(self.run_pass)  # the pass reads every attempt, touched ones included
                    next_pass = time.monotonic() + self.options.poll_interval
                elif touched:
                    self.guarded(self.run_touched, touched)
                self.wake.wait(max(0.0, next_pass - time.monotonic()))
        finally:
            self.stop.set()
            self.sweeper.close()
            self.watch.close()
            self.db.close()


def batch_script(fleet: FleetState, due: dict, directory: Path, extra_env: dict) -> str:
    """The sbatch script: one task per node; the prepare step, the wait for the decision the worker writes
    after the database recorded it, and the workload step only after COMMIT."""
    python = sys.executable
    nodes = int(due["nodes"])
    lines = [
        "#!/bin/bash",
        f"#SBATCH --job-name={job_name(due['attempt_id'])}",
        f"#SBATCH --partition={fleet.partition}",
        f"#SBATCH --nodes={nodes}",
        "#SBATCH --ntasks-per-node=1",
        f"#SBATCH --cpus-per-task={max(1, int(due['cpus_per_node']))}",
        f"#SBATCH --output={directory}/batch.log",
        "#SBATCH --open-mode=append",
        "#SBATCH --no-requeue",
    ]
    minutes = due.get("time_limit_minutes")  # the JobSpec's limit and its grace (slurm_time_limit_minutes)
    if minutes:
        lines.append(f"#SBATCH --time={int(minutes)}")
    if int(due["gpus_per_node"]) > 0:
        lines.append(f"#SBATCH --gres=gpu:{int(due['gpus_per_node'])}")
    # The job's team's account on this fleet (docs/teams.md), else the fleet's own.
    account = due.get("account") or fleet.account
    if account:
        lines.append(f"#SBATCH --account={account}")
    if fleet.qos:
        lines.append(f"#SBATCH --qos={fleet.qos}")
    for key, value in extra_env.items():
        lines.append(f"export {key}={shell_quote(str(value))}")
    d = shell_quote(str(directory))
    step = f"srun --nodes={nodes} --ntasks={nodes} --ntasks-per-node=1 --kill-on-bad-exit=0"
    lines += [
        f"D={d}",
        f"PY={shell_quote(python)}",
        'echo "tuneplane: allocation $SLURM_JOB_ID on $SLURM_JOB_NODELIST"',
        # Wakes the worker at once (ADR 0165): it reads the allocation from Slurm (squeue -j) and records it.
        'mkdir -p "$D/reports"',
        'echo "$SLURM_JOB_NODELIST" > "$D/reports/.allocated.tmp" && mv "$D/reports/.allocated.tmp" '
        '"$D/reports/allocated"',
        # One step per node: prepare (the capsule at once; the member once plan.json is written), wait for
        # the decision the worker writes after the database recorded it, run the member only on commit.
        f'{step} "$PY" -P -m tuneplane.workers.slurm.step launch "$D"',
    ]
    return "\n".join(lines) + "\n"


def signalled_at(path: Path) -> float | None:
    """When the signal reached the step (its `signalled` report), in epoch seconds."""
    try:
        return float(json.loads(path.read_text())["at"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def job_name(attempt_id: int) -> str:
    """The Slurm job name of an attempt (how a restarted worker finds a job it submitted)."""
    return f"tp-a{attempt_id}"


def shell_quote(text: str) -> str:
    return "'" + text.replace("'", "'\"'\"'") + "'"


def main(options: SlurmWorkerOptions) -> None:
    from tuneplane.app.cli import ExpectedError

    worker = SlurmWorker(options, say=lambda line: print(line, flush=True))
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: (worker.stop.set(), worker.wake.set()))
    try:
        worker.run()
    except UnsupportedSlurm as exc:
        raise ExpectedError(f"tuneplane worker --backend slurm refuses to start: {exc}") from exc
