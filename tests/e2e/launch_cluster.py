"""A small real cluster for the launch end-to-end tests: a node gateway, node agents and backend workers
as subprocesses on loopback, one real database, jobs submitted through the submission functions.

Thresholds are short (heartbeat 0.3 s, lost after 3 s, stop grace 3 s) so crash tests finish quickly.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import gzip
import io
import json
import os
import signal
import subprocess
import tarfile
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from tests.conftest import free_port
from tests.e2e.node_processes import Proc, start_gateway
from tests.helpers import wait_for
from tests.node_helpers import fast_thresholds, make_token
from tests.submission_setup import add_user
from tuneplane.app import db_functions as fn
from tuneplane.app.blobstore import BlobStore, FilesystemBlobStore
from tuneplane.app.db import Database
from tuneplane.app.submission import archives, service

HEARTBEAT, STALE, LOST = 0.3, 1.5, 3.0
# The rendezvous ports of a test cluster (a block below the ephemeral range: tests.conftest.free_port).
RENDEZVOUS_SPAN = 40
MIB = 1024**2

# A tiny member for the fault tests: BEFORE metric points, a 64 KiB checkpoint in output/ckpt, a `started`
# marker, then it waits for RELEASE_FLAG; after it, AFTER more points, BURST_LINES lines of output (the
# agent is still draining them as the end is reported), and exit status EXIT.
TINY_MEMBER = """
import json, os, pathlib, sys, time
out = pathlib.Path(os.environ["TUNEPLANE_OUTPUT_DIR"])
before, after = int(os.environ.get("BEFORE", "0")), int(os.environ.get("AFTER", "0"))
def points(steps):
    with open(out / "metrics.jsonl", "a") as f:
        for step in steps:
            f.write(json.dumps({"step": step, "loss": 1.0 / (step + 1)}) + "\\n")
points(range(before))
(out / "ckpt").mkdir(parents=True, exist_ok=True)
(out / "ckpt" / "weights.bin").write_bytes(os.urandom(int(os.environ.get("CKPT_BYTES", "65536"))))
(out / "started").write_text(str(os.getpid()))
flag = pathlib.Path(os.environ["RELEASE_FLAG"])
while not flag.exists():
    time.sleep(0.02)
points(range(before, before + after))
for i in range(int(os.environ.get("BURST_LINES", "0"))):
    print(f"line {i:06d} " + "x" * 90)
sys.exit(int(os.environ.get("EXIT", "0")))
"""


def source_archive(files: dict[str, str]) -> bytes:
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w") as tar:
        for name, text in sorted(files.items()):
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(data), 0o644, 0
            tar.addfile(info, io.BytesIO(data))
    return gzip.compress(raw.getvalue(), mtime=0)


@dataclass
class Cluster:
    db_url: str
    db: Database
    root: Path
    gateway_port: int
    fleet: str = "gpu"
    gateway: Proc | None = None
    agents: dict[str, Proc] = field(default_factory=dict)
    workers: list[Proc] = field(default_factory=list)
    user_id: int = 0
    telemetry: subprocess.Popen | None = None
    # Variables only the server side gets (an S3 fleet's store credentials: the node gateway and the
    # worker); agents and their members never see them.
    server_env: dict[str, str] = field(default_factory=dict)

    @property
    def data_dir(self) -> Path:
        return self.root / "data"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.gateway_port}"

    def start(
        self, *, stop_grace: float = 3.0, prepare_timeout: float = 40.0, gateway_args: tuple[str, ...] = ()
    ) -> None:
        fast_thresholds(self.db, heartbeat=HEARTBEAT, stale=STALE, lost=LOST)
        self.db.fetch_all(
            """UPDATE launch_settings SET stop_grace = %s, prepare_timeout = %s, rendezvous_port_base = %s,
                      rendezvous_port_span = %s RETURNING 1""",
            (
                dt.timedelta(seconds=stop_grace),
                dt.timedelta(seconds=prepare_timeout),
                free_port(RENDEZVOUS_SPAN),
                RENDEZVOUS_SPAN,
            ),
        )
        self.db.call("create_fleet", self.fleet, "node", None, None)
        self.user_id = add_user(self.db, "alice")
        self.gateway = self._start_gateway(*gateway_args)

    def _start_gateway(self, *args: str) -> Proc:
        return start_gateway(
            self.db_url, self.gateway_port, "--data-dir", str(self.data_dir), *args, extra_env=self.server_env
        )

    def start_telemetry_gateway(self) -> str:
        from tests.conftest import free_port
        from tests.e2e.telemetry_processes import start_gateway as start_telemetry

        port = free_port()
        self.telemetry = start_telemetry(self.db_url, port, self.root / "telemetry-gateway.log")
        return f"http://127.0.0.1:{port}"

    def agent_dirs(self, name: str) -> tuple[Path, Path]:
        return self.root / name / "state", self.root / name / "work"

    def start_agent(self, name: str, *extra: str, enroll: bool = True, server: str | None = None) -> Proc:
        """An agent dialing the gateway (or `server`, e.g. a proxy in front of it)."""
        server = server or self.url
        state, work = self.agent_dirs(name)
        argv = [
            "node",
            "--server",
            server,
            "--state-dir",
            str(state),
            "--work-dir",
            str(work),
            "--name",
            name,
            "--max-backoff",
            "1",
            "--simulate-gpus",
            "0",
            *extra,
        ]
        if enroll and not (state / "node-credential.json").exists():
            argv += ["--enroll-token", make_token(self.db, self.fleet)]
        proc = Proc(argv)
        self.agents[name] = proc
        proc.wait_line(f"connected to {server} as node {self.fleet}/{name}")
        wait_for(
            lambda: self.node(name)["probe_port"] is not None and self.node(name)["cpus"] > 0,
            timeout=20,
            what=f"{name} reported its capacity and probe port",
        )
        return proc

    def start_worker(self, *extra: str) -> Proc:
        argv = [
            "worker",
            "--backend",
            "node",
            "--database-url",
            self.db_url,
            "--data-dir",
            str(self.data_dir),
            "--poll-interval",
            "0.3",
            "--heartbeat-timeout",
            "15",
            *extra,
        ]
        proc = Proc(argv, self.server_env)
        proc.wait_line("consuming `launch`")
        self.workers.append(proc)
        return proc

    def node(self, name: str) -> dict:
        return self.db.fetch_one(
            "SELECT n.*, tuneplane.node_connectivity(n.last_heartbeat_at) AS connectivity FROM nodes n"
            " WHERE name = %s",
            (name,),
        )

    def restart_gateway(self, meanwhile: Callable[[], object] | None = None) -> None:
        """kill -9 the node gateway, run `meanwhile`, and start the gateway again on the same port."""
        assert self.gateway is not None
        self.kill9(self.gateway)
        if meanwhile is not None:
            meanwhile()
        self.gateway = self._start_gateway()

    def kill9_pid(self, pid: int) -> None:
        os.kill(pid, signal.SIGKILL)

    def kill9(self, proc: Proc) -> None:
        proc.process.send_signal(signal.SIGKILL)
        proc.process.wait(10)

    def stop_all(self) -> None:
        for proc in [*self.workers, *self.agents.values()]:
            proc.stop()
        if self.gateway is not None:
            self.gateway.stop()
        if self.telemetry is not None:
            self.telemetry.terminate()
            self.telemetry.wait(10)
        self.kill_member_processes()

    def kill_member_processes(self) -> None:
        """Members' runners, keepers and workloads outlive their agent (by design); a test that failed before
        letting its workload end would leave them running into the next tests. Each one works in its member
        directory (<root>/<node>/work/members/<id>), so that is how they are found."""
        members = str(self.root.resolve()) + os.sep
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            with contextlib.suppress(OSError):
                cwd = os.readlink(entry / "cwd")
                if cwd.startswith(members) and f"{os.sep}work{os.sep}members{os.sep}" in cwd[len(members) :]:
                    os.kill(int(entry.name), signal.SIGKILL)

    # ---- jobs ---------------------------------------------------------------------------------------

    def upload_source(self, files: dict[str, str], store: BlobStore | None = None) -> str:
        """The archive kept in the server's blob store, or in `store` (an S3 fleet's: /sources?fleet=)."""
        blobs = store if store is not None else FilesystemBlobStore(self.data_dir / "blobs")
        facts = archives.receive_archive(self.db, blobs, self.user_id, io.BytesIO(source_archive(files)))
        return facts.sha256

    def submit(self, spec: dict) -> int:
        spec = {"fleet": self.fleet, **spec}
        preview = service.create_preview(self.db, self.user_id, spec)
        receipt = service.confirm(self.db, self.user_id, preview["id"], preview["digest"], str(uuid.uuid4()))
        return int(receipt["job_id"])

    def job(self, job_id: int) -> dict:
        return self.db.fetch_one("SELECT * FROM jobs WHERE id = %s", (job_id,))

    def members(self, job_id: int) -> list[dict]:
        return self.db.fetch_all(
            "SELECT m.*, n.name AS node FROM members m JOIN nodes n ON n.id = m.node_id"
            " WHERE m.job_id = %s ORDER BY m.attempt_id, m.rank",
            (job_id,),
        )

    def wait_job(self, job_id: int, states: tuple[str, ...], timeout: float = 60.0) -> dict:
        def reached() -> dict | None:
            row = self.job(job_id)
            return row if row["state"] in states else None

        try:
            return wait_for(reached, timeout=timeout, what=f"job {job_id} in {states}")
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{self.diagnose(job_id)}") from None

    def wait_members(self, job_id: int, state: str, timeout: float = 60.0) -> list[dict]:
        def reached() -> list[dict] | None:
            # The newest attempt's members: a launch aborted before anything started (e.g. a MASTER_PORT
            # taken by another process on this shared machine) is superseded by a free re-launch.
            rows = self.members(job_id)
            newest = max((m["attempt_id"] for m in rows), default=None)
            rows = [m for m in rows if m["attempt_id"] == newest]
            return rows if rows and all(m["state"] == state for m in rows) else None

        try:
            return wait_for(reached, timeout=timeout, what=f"members of job {job_id} {state}")
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{self.diagnose(job_id)}") from None

    def wait_contact_lost(self, job_id: int, timeout: float = 20.0) -> list[dict]:
        """Every member of the job marked contact-lost (its state is kept: contact loss is not a state)."""

        def reached() -> list[dict] | None:
            rows = self.members(job_id)
            return rows if rows and all(m["contact_lost_at"] is not None for m in rows) else None

        try:
            return wait_for(reached, timeout=timeout, what=f"members of job {job_id} contact-lost")
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{self.diagnose(job_id)}") from None

    def attempt(self, job_id: int, number: int) -> dict | None:
        """Attempt `number` of the job, with the checkpoint it ended with (preemption: name, step, when it
        was verified)."""
        return self.db.fetch_one(
            """SELECT t.*, a.name AS end_checkpoint, a.step AS end_checkpoint_step,
                      a.completed_at AS end_checkpoint_at
                 FROM attempts t LEFT JOIN artifacts a ON a.id = t.end_checkpoint_id
                WHERE t.job_id = %s AND t.number = %s""",
            (job_id, number),
        )

    def checkpoints(self, job_id: int) -> list[dict]:
        """The job's verified checkpoints, oldest first."""
        return self.db.fetch_all(
            "SELECT * FROM artifacts WHERE job_id = %s AND kind = 'checkpoint' AND state = 'complete'"
            " ORDER BY completed_at, id",
            (job_id,),
        )

    def preempt_after_a_checkpoint(
        self, job_id: int, reason: str, *, checkpoint_timeout: float = 60.0, timeout: float = 60.0
    ) -> dict:
        """Once the job has a verified checkpoint, ask it to checkpoint and stop (request_preemption, what
        the planner and `tuneplane jobs preempt` call); its attempt 1 once it ended `preempted`."""
        wait_for(
            lambda: self.checkpoints(job_id),
            timeout=checkpoint_timeout,
            what="a first verified checkpoint",
            explain=lambda: self.explain(job_id),
        )
        self.db.call("request_preemption", job_id, reason, None, "preempted", None)
        return wait_for(
            lambda: (a := self.attempt(job_id, 1)) and a["state"] == "preempted" and a,
            timeout=timeout,
            what="attempt 1 preempted",
            explain=lambda: self.explain(job_id),
        )

    def resumed_after_preemption(self, job_id: int, first: dict) -> tuple[dict, int]:
        """After attempt 1 ended preempted (`first`, from preempt_after_a_checkpoint or attempt()): the
        job succeeds, its attempt 2 resumed from the checkpoint attempt 1 ended with, and that member's
        resume directory holds it. Returns (attempt 2's member, the step it resumed from)."""
        saved, why = first["end_checkpoint_step"], first["reason"]
        assert f"checkpoint {first['end_checkpoint']} (step {saved}) verified" in why, why
        done = self.wait_job(job_id, ("succeeded", "failed"), timeout=120)
        assert done["state"] == "succeeded", self.diagnose(job_id)
        second = self.attempt(job_id, 2)
        assert second is not None and second["resume_artifact_id"] == first["end_checkpoint_id"]
        (member,) = self.members_of_attempt(job_id, 2)
        resume = self.member_dir(member["node"], member["id"]) / "resume"
        resumed = json.loads((resume / "state.json").read_text())["step"]
        assert resumed == saved
        return member, resumed

    def resume_past_a_damaged_checkpoint(self, job_id: int, damage: Callable[[dict], None]) -> dict:
        """Issue 35's scenario, whatever the store: once the job (on agent `a`, max_attempts 2) has two
        verified checkpoints, node a is fenced (attempt 1 of 2 fails); `damage(file)` flips bytes of one
        file of the newest checkpoint that no other artifact shares (its artifact_file_list row); agent `b`
        starts.
        Checks the job then succeeds from the previous checkpoint, the newest named corrupt in the timeline,
        without spending an attempt. Returns the corruption row (who found it)."""
        self.wait_members(job_id, "running", timeout=60)
        wait_for(lambda: len(self.checkpoints(job_id)) >= 2, timeout=60, what="two verified checkpoints")
        self.db.call("fence_node", f"{self.fleet}/a", "e2e: node lost", "user:test")
        self.wait_job(job_id, ("queued",), timeout=60)  # no other node yet: the checkpoints are final
        *_, previous, newest = self.checkpoints(job_id)
        shared = {r["sha256"] for r in self.db.fetch_all(
            "SELECT sha256 FROM artifact_files WHERE artifact_id <> %s", (newest["id"],))}  # fmt: skip
        damage(next(f for f in self.db.call(fn.artifact_file_list, newest["id"])
                    if f["size"] > 0 and f["sha256"] not in shared))  # fmt: skip
        self.start_agent("b")
        done = self.wait_job(job_id, ("succeeded", "failed"), timeout=120)
        assert done["state"] == "succeeded", self.diagnose(job_id)
        ran = self.db.fetch_one("SELECT * FROM attempts WHERE job_id = %s AND state = 'succeeded'", (job_id,))
        assert ran["resume_artifact_id"] == previous["id"], self.diagnose(job_id)
        reasons = [e["reason"] for e in self.db.fetch_all(
            "SELECT reason FROM job_events WHERE job_id = %s ORDER BY id", (job_id,))]  # fmt: skip
        assert any(f"checkpoint {newest['name']}" in r and "is corrupt" in r for r in reasons), reasons
        assert self.job(job_id)["corrupt_resumes_used"] == 1
        corruptions = "SELECT * FROM artifact_corruptions WHERE artifact_id = %s"
        corrupt = self.db.fetch_one(corruptions, (newest["id"],))
        assert corrupt is not None
        return corrupt

    def members_of_attempt(self, job_id: int, number: int) -> list[dict]:
        attempt = self.attempt(job_id, number)
        assert attempt is not None, f"job {job_id} has no attempt {number}"
        return [m for m in self.members(job_id) if m["attempt_id"] == attempt["id"]]

    def member_log(self, member: dict, name: str = "stdout.log") -> str:
        path = self.member_dir(member["node"], member["id"]) / "logs" / name
        return path.read_text(errors="replace") if path.is_file() else ""

    def explain(self, job_id: int) -> str:
        """The job's events and processes, and what each member printed (for a test that timed out)."""
        lines = [self.diagnose(job_id)]
        for member in self.members(job_id):
            for name in ("stdout.log", "stderr.log", "runner.log"):
                if text := self.member_log(member, name):
                    lines.append(f"--- member {member['id']} {name}:\n{text[-2000:]}")
        return "\n".join(lines)

    def held(self) -> int:
        return self.db.fetch_one("SELECT count(*) AS n FROM members WHERE released_at IS NULL")["n"]

    def member_dir(self, agent: str, member_id: int) -> Path:
        return self.agent_dirs(agent)[1] / "members" / str(member_id)

    def diagnose(self, job_id: int) -> str:
        lines = [f"job: {self.job(job_id)}"]
        lines += [f"member: {m}" for m in self.members(job_id)]
        for event in self.db.fetch_all("SELECT * FROM job_events WHERE job_id = %s ORDER BY id", (job_id,)):
            lines.append(f"event: {event}")
        for name, proc in self.agents.items():
            lines.append(f"--- agent {name}:\n" + "\n".join(proc.out.lines[-30:]))
        for m in self.members(job_id):
            # The member's own words: a workload's failure is explained there, not in the agent's log.
            logs = self.member_dir(m["node"], m["id"]) / "logs"
            for name in ("stdout.log", "stderr.log", "runner.log"):
                with contextlib.suppress(OSError):
                    tail = (logs / name).read_text(errors="replace").splitlines()[-20:]
                    lines.append(f"--- member {m['id']} (rank {m['rank']}) {name}:\n" + "\n".join(tail))
        for index, proc in enumerate(self.workers):
            lines.append(f"--- worker {index}:\n" + "\n".join(proc.out.lines[-15:]))
        return "\n".join(lines)
