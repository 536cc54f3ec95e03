"""The Slurm backend end to end: a real slurmctld and two slurmd virtual nodes with fake GPUs (the session
fixture `slurm_cluster`), a real PostgreSQL, the Slurm worker (in a thread of this process) running the real
sbatch/squeue/scontrol/scancel, and real job steps running `tuneplane runner` for each member."""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.submission_setup import add_user
from tuneplane.app.blobstore import FilesystemBlobStore
from tuneplane.app.db import Database
from tuneplane.app.errors import Refusal
from tuneplane.app.submission import service
from tuneplane.workers.artifacts.manifest import Manifest
from tuneplane.workers.artifacts.verify import verify_directory
from tuneplane.workers.slurm.worker import SlurmWorker, SlurmWorkerOptions

MEMBER = b"""import os, signal, sys, time
rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
print(f"rank {rank} of {world} master {os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}", flush=True)
assert world == 2, world
if os.environ.get("TRAP") == "1":
    # A workload that saves on SIGTERM and exits 0 (Slurm then records a preempted job as COMPLETED).
    signal.signal(signal.SIGTERM, lambda *_: (print("SIGTERM: saved, exiting 0", flush=True), sys.exit(0)))
if os.environ.get("SLEEP_ON_ATTEMPT", os.environ["TUNEPLANE_ATTEMPT"]) == os.environ["TUNEPLANE_ATTEMPT"]:
    deadline = time.monotonic() + float(os.environ.get("SLEEP", "0"))
    while time.monotonic() < deadline:
        time.sleep(0.1)
sys.exit(int(os.environ.get("EXIT", "0")))
"""


TRAIN = b"""import json, os, torch, torch.distributed as dist
dist.init_process_group("gloo")
value = torch.tensor([float(dist.get_rank() + 1)])
dist.all_reduce(value)
seen = {k: os.environ.get(k) for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
        "TUNEPLANE_MEMBER_RANK", "TUNEPLANE_TELEMETRY_TOKEN")}
seen["sum"] = value.item()
out = os.environ["TUNEPLANE_OUTPUT_DIR"]
with open(os.path.join(out, "metrics.jsonl"), "w") as f:
    for step in range(1, 4):
        f.write(json.dumps({"step": step, "loss": 1.0 / (step * (dist.get_rank() + 1))}) + "\\n")
with open(os.path.join(out, "seen.json"), "w") as f:
    json.dump(seen, f)
os.makedirs(os.path.join(out, "model"), exist_ok=True)
with open(os.path.join(out, "model", "weights.txt"), "w") as f:
    f.write(f"rank {dist.get_rank()} weights {value.item()}\\n" * 100)
print("rank", dist.get_rank(), "sum", value.item(), flush=True)
dist.destroy_process_group()
"""


def archive(files: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


class Harness:
    def __init__(
        self,
        db: Database,
        db_url: str,
        cluster,
        tmp: Path,
        batch_env: dict | None = None,
        telemetry_url: str | None = None,
        submit_grace: float = 30.0,
        files: dict[str, bytes] | None = None,
        poll_interval: float = 0.3,
    ) -> None:
        self.db, self.cluster, self.db_url = db, cluster, db_url
        self.shared = cluster.shared / uuid.uuid4().hex[:8]
        self.shared.mkdir(parents=True)
        self.user = add_user(db, "alice")
        capabilities = {"shared_path": str(self.shared)}
        if telemetry_url:
            capabilities["telemetry_url"] = telemetry_url
        db.call("create_slurm_fleet", "hpc", "batch", str(cluster.conf), json.dumps(capabilities))
        self.blobs = FilesystemBlobStore(tmp / "blobs")
        files = {"main.py": MEMBER, "train.py": TRAIN, **(files or {})}
        data = archive(files)
        self.sha = hashlib.sha256(data).hexdigest()
        with self.blobs.stage() as (staged, handle):
            handle.write(data)
            handle.flush()
            self.blobs.commit_staged(staged, self.sha)
        db.call(
            "record_source_archive", self.user, self.sha, len(data), len(files), sum(map(len, files.values()))
        )
        self.lines: list[str] = []
        self.worker = SlurmWorker(
            SlurmWorkerOptions(
                db_url,
                tmp / "blobs",
                "slurm-test",
                poll_interval=poll_interval,
                batch_env=batch_env or {},
                submit_grace=submit_grace,
            ),
            say=self.lines.append,
        )
        self.thread = threading.Thread(target=self.worker.run, daemon=True)

    def restart_worker(self) -> None:
        """A new worker process's worth: a fresh SlurmWorker with the same options (nothing in memory)."""
        self.stop()
        self.worker = SlurmWorker(self.worker.options, say=self.lines.append)
        self.thread = threading.Thread(target=self.worker.run, daemon=True)
        self.thread.start()

    def start(self) -> None:
        self.thread.start()
        self.wait(lambda: self.db.fetch_one("SELECT count(*) AS n FROM nodes")["n"] == 2, "nodes synced")

    def stop(self) -> None:
        self.worker.stop.set()
        self.worker.wake.set()
        self.thread.join(30)

    def submit(
        self,
        nodes: int = 2,
        gpus: int = 1,
        env: dict | None = None,
        max_attempts: int = 1,
        partition_fleet: str = "hpc",
        source: dict | None = None,
        outputs: list | None = None,
        time_limit_minutes: int | None = None,
        preemption: dict | None = None,
    ) -> int:
        spec = {
            "source": source or {"archive": f"sha256:{self.sha}", "entrypoint": "python main.py"},
            "resources": {"nodes": nodes, "gpus_per_node": gpus, "cpus_per_node": 1}
            | ({"time_limit_minutes": time_limit_minutes} if time_limit_minutes else {}),
            "fleet": partition_fleet,
            "env": env or {},
            "max_attempts": max_attempts,
            "outputs": outputs or [],
        } | ({"preemption": preemption} if preemption else {})
        preview = service.create_preview(self.db, self.user, spec)
        return service.confirm(self.db, self.user, preview["id"], preview["digest"], uuid.uuid4().hex)[
            "job_id"
        ]

    def job(self, job_id: int) -> dict:
        return self.db.fetch_one("SELECT * FROM jobs WHERE id = %s", (job_id,))

    def wait(self, predicate, what: str, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if predicate():
                return
            time.sleep(0.2)
        raise AssertionError(f"timed out waiting for {what}; worker said: {self.lines[-15:]}")

    def wait_state(self, job_id: int, *states: str, timeout: float = 60.0) -> dict:
        self.wait(lambda: self.job(job_id)["state"] in states, f"job {job_id} in {states}", timeout)
        return self.job(job_id)

    def slurm_id(self, job_id: int) -> int | None:
        row = self.db.fetch_one(
            "SELECT slurm_job_id FROM slurm_jobs WHERE job_id = %s ORDER BY attempt_id DESC LIMIT 1",
            (job_id,),
        )
        return row and row["slurm_job_id"]

    def members(self, job_id: int) -> list[dict]:
        return self.db.fetch_all(
            "SELECT m.*, n.name AS node, a.number AS attempt FROM members m JOIN nodes n ON n.id = m.node_id"
            " JOIN attempts a ON a.id = m.attempt_id WHERE m.job_id = %s ORDER BY a.number, m.rank",
            (job_id,),
        )

    def events(self, job_id: int) -> list[str]:
        return [
            r["reason"]
            for r in self.db.fetch_all(
                "SELECT reason FROM job_events WHERE job_id = %s ORDER BY id", (job_id,)
            )
        ]


@pytest.fixture
def harness(db: Database, db_url: str, slurm_cluster, tmp_path: Path) -> Iterator[Harness]:
    h = Harness(db, db_url, slurm_cluster, tmp_path)
    h.start()
    yield h
    h.stop()
    slurm_cluster.run("scancel", "--full", "-u", "root", check=False)


def test_two_member_job_runs_as_one_slurm_gang_job_and_each_member_saw_its_rank(harness: Harness) -> None:
    job_id = harness.submit()
    job = harness.wait_state(job_id, "succeeded", "failed", "cancelled")
    assert job["state"] == "succeeded", (job["state_reason"], harness.lines[-10:])
    members = harness.members(job_id)
    assert [(m["rank"], m["state"], m["exit_code"]) for m in members] == [(0, "exited", 0), (1, "exited", 0)]
    assert {m["node"] for m in members} == {"tpn1", "tpn2"}
    attempt = harness.db.fetch_one("SELECT * FROM attempts WHERE job_id = %s", (job_id,))
    logs = [
        (
            harness.shared / "attempts" / str(attempt["id"]) / "members" / str(r) / "logs" / "stdout.log"
        ).read_text()
        for r in (0, 1)
    ]
    for rank, text in enumerate(logs):
        assert f"rank {rank} of 2 master {attempt['master_addr']}:{attempt['master_port']}" in text
    assert harness.slurm_id(job_id) is not None
    decision = harness.db.fetch_one(
        "SELECT decision FROM launch_decisions WHERE attempt_id = %s", (attempt["id"],)
    )
    assert decision["decision"] == "commit"
    # stdout reached the job's logs (what `tuneplane jobs logs` and the job page read)
    from tuneplane.app.web import create_app

    client = create_app(harness.db_url).test_client()
    with client.session_transaction() as session:
        session["user_id"] = harness.user
    for rank in (0, 1):
        log = client.get(f"/jobs/{job_id}/logs?member={rank}", headers={"Accept": "application/json"}).json
        assert f"rank {rank} of 2 master" in log["text"], log
    harness.wait(lambda: harness.cluster.squeue_ids() == [], "the Slurm job gone")
    harness.wait(
        lambda: harness.db.fetch_one("SELECT gone_at FROM slurm_jobs")["gone_at"] is not None, "gone"
    )


def test_fleet_page_shows_slurm_state_and_controller_reachability_and_plugins_list_the_backend(
    harness: Harness, db_url: str
) -> None:
    from tuneplane.app.security import hash_password
    from tuneplane.app.web import create_app

    admin = harness.db.call("create_user", "root", hash_password("pw"), "admin")[0]["id"]
    client = create_app(db_url).test_client()
    with client.session_transaction() as session:
        session["user_id"] = admin
    harness.cluster.run("scontrol", "update", "NodeName=tpn2", "State=DRAIN", "Reason=disk-check")
    try:
        harness.wait(
            lambda: (
                harness.db.fetch_one(
                    "SELECT s.slurm_state FROM slurm_nodes s JOIN nodes n ON n.id = s.node_id"
                    " WHERE n.name = 'tpn2'"
                )["slurm_state"]
                == "drain"
            ),
            "drain seen",
        )
        html = client.get("/fleets/hpc").get_data(as_text=True)
    finally:
        harness.cluster.run("scontrol", "update", "NodeName=tpn2", "State=RESUME")
    assert 'class="state scheduling idle"' in html and 'class="state scheduling drain"' in html
    assert "disk-check" in html
    assert 'class="state connectivity controller reachable"' in html
    assert "Slurm 22.05" in html and "partition <code>batch</code>" in html
    nodes = harness.db.fetch_all("SELECT name, cpus, memory_bytes FROM nodes ORDER BY name")
    assert [(n["name"], n["cpus"]) for n in nodes] == [("tpn1", 2), ("tpn2", 2)]
    assert harness.db.fetch_one("SELECT count(*) AS n FROM node_gpus")["n"] == 4
    plugins = client.get("/plugins").get_data(as_text=True)
    assert "slurm" in plugins and "queue_reasons" in plugins and "preemption" in plugins
    harness.cluster.wait_idle(30)


def test_two_member_torchrun_job_over_gloo_succeeds_and_each_members_metrics_are_shipped(
    db: Database, db_url: str, slurm_cluster, tmp_path: Path
) -> None:
    pytest.importorskip("torch")
    from tests.conftest import free_port
    from tests.e2e.telemetry_processes import start_gateway

    port = free_port()
    gateway = start_gateway(db_url, port, tmp_path / "telemetry-gateway.log")
    h = Harness(db, db_url, slurm_cluster, tmp_path, telemetry_url=f"http://127.0.0.1:{port}")
    h.start()
    try:
        job_id = h.submit(
            gpus=1,
            env={"OMP_NUM_THREADS": "1"},
            source={"archive": f"sha256:{h.sha}", "entrypoint": "python train.py", "integration": "torchrun"},
            outputs=[{"name": "model", "path": "model"}],
        )
        job = h.wait_state(job_id, "succeeded", "failed", "cancelled", timeout=120)
        assert job["state"] == "succeeded", job["state_reason"]
        attempt = db.fetch_one("SELECT * FROM attempts WHERE job_id = %s", (job_id,))
        members_dir = h.shared / "attempts" / str(attempt["id"]) / "members"
        seen = {r: json.loads((members_dir / str(r) / "output" / "seen.json").read_text()) for r in (0, 1)}
        assert [seen[r]["RANK"] for r in (0, 1)] == ["0", "1"]
        assert {seen[r]["WORLD_SIZE"] for r in (0, 1)} == {"2"}
        assert [seen[r]["sum"] for r in (0, 1)] == [3.0, 3.0]  # the all_reduce joined both nodes' members
        h.wait(
            lambda: (
                [
                    (s["member_rank"], s["state"])
                    for s in db.fetch_all(
                        "SELECT member_rank, state FROM telemetry_members WHERE job_id = %s ORDER BY 1",
                        (job_id,),
                    )
                ]
                == [(0, "complete"), (1, "complete")]
            ),
            "both members' metrics complete",
        )
        series = db.fetch_all(
            "SELECT member_rank, count(p.*) AS points FROM telemetry_series s JOIN telemetry_points p"
            " ON p.series_id = s.id WHERE s.job_id = %s AND s.name = 'loss' GROUP BY 1 ORDER BY 1",
            (job_id,),
        )
        assert [(r["member_rank"], r["points"]) for r in series] == [(0, 3), (1, 3)]
        # Charted: the console's chart data for the job has the loss of both members.
        from tuneplane.app.web import create_app

        client = create_app(db_url).test_client()
        with client.session_transaction() as session:
            session["user_id"] = h.user
        charted = client.get(f"/jobs/{job_id}/metrics?name=loss", headers={"Accept": "application/json"})
        assert charted.status_code == 200, charted.get_data(as_text=True)
        lines = {(x["member"], len(x["buckets"])) for x in charted.json["series"] if x["canonical"] == "loss"}
        assert lines == {(0, 3), (1, 3)}, charted.json
        # The output of each member is an artifact delivered on the shared path, verified file by file.
        h.wait(
            lambda: len(db.fetch_all("SELECT id FROM artifacts WHERE state = 'complete'")) == 2, "artifacts"
        )
        for artifact in db.fetch_all("SELECT * FROM artifacts WHERE job_id = %s ORDER BY rank", (job_id,)):
            assert (artifact["name"], artifact["delivery"]) == ("model", "shared")
            manifest = Manifest.from_json(artifact["manifest"])
            assert verify_directory(artifact["shared_path"], manifest).ok
            assert [f.path for f in manifest.files] == ["weights.txt"]
    finally:
        h.stop()
        gateway.terminate()
        gateway.wait(10)


def test_a_worker_that_died_before_recording_sbatch_adopts_the_named_job_or_aborts_and_retries(
    db: Database, db_url: str, slurm_cluster, tmp_path: Path
) -> None:
    """What a worker killed between slurm_submissions_due and slurm_submitted leaves: attempts without a
    Slurm job id. A Slurm job with the attempt's name is adopted; none at all → the attempt is aborted
    (never submitted) and the job is retried by max_attempts."""
    h = Harness(db, db_url, slurm_cluster, tmp_path, submit_grace=1.0)
    h.start()
    h.stop()  # the nodes are synced; no worker runs while the dead one's leftovers are made
    adopted_job = h.submit(gpus=1, max_attempts=1)
    lost_job = h.submit(gpus=1, max_attempts=2)
    fleet = db.fetch_one("SELECT id FROM fleets")["id"]
    # what the dead worker did: attempts made, sbatch not recorded
    due = {r["job_id"]: r["attempt_id"] for r in db.call("slurm_submissions_due", fleet)}
    slurm_id = slurm_cluster.run(
        "sbatch", "--parsable", "-p", "batch", f"--job-name=tp-a{due[adopted_job]}", "--hold",
        "-o", "/dev/null", "--wrap", "true",
    ).strip()  # fmt: skip
    h.restart_worker()
    try:
        h.wait(lambda: h.slurm_id(adopted_job) == int(slurm_id), "the named job adopted")
        h.wait(lambda: "reason JobHeldUser" in h.job(adopted_job)["state_reason"], "held reason")
        assert "held (Slurm job" in h.job(adopted_job)["state_reason"]
        job = h.wait_state(lost_job, "succeeded", "failed", timeout=90)
        assert job["state"] == "succeeded", job["state_reason"]
        first = db.fetch_one("SELECT * FROM attempts WHERE job_id = %s AND number = 1", (lost_job,))
        assert first["state"] == "aborted" and "never submitted to Slurm" in first["reason"], first
        db.call("cancel_job", adopted_job, h.user, "test")
        h.wait(lambda: slurm_id not in slurm_cluster.squeue_ids(), "the held job cancelled in Slurm")
    finally:
        h.stop()


def test_the_end_of_a_job_the_controller_forgot_comes_from_the_completion_record(slurm_cluster) -> None:
    """After MinJobAge scontrol no longer knows a job; without accounting storage (this cluster) the
    jobcomp/filetxt record says how it ended."""
    from tuneplane.workers.slurm.cli import SlurmCli

    cli = SlurmCli(str(slurm_cluster.conf))
    done = int(slurm_cluster.run("sbatch", "--parsable", "-p", "batch", "-o", "/dev/null", "--wrap", "true"))
    failed = int(
        slurm_cluster.run("sbatch", "--parsable", "-p", "batch", "-o", "/dev/null", "--wrap", "exit 3")
    )
    deadline = time.monotonic() + 30
    while {str(done), str(failed)} & set(slurm_cluster.squeue_ids()) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert cli.completion_record(done)[0] == "COMPLETED"
    state, detail = cli.completion_record(failed)
    assert state == "FAILED" and "exit code 3:0" in detail, detail
    assert cli.completion_record(999999)[0] == "UNKNOWN"


def test_the_worker_command_runs_a_job_and_refuses_an_unsupported_slurm_in_one_line(
    db: Database, db_url: str, slurm_cluster, tmp_path: Path
) -> None:
    """`tuneplane worker --backend slurm` as its own process (the harness's worker runs in a thread)."""
    import os
    import subprocess
    import sys

    data = tmp_path / "data"
    h = Harness(db, db_url, slurm_cluster, data)  # the archive goes to <data>/blobs, the worker's blob store
    env = {k: v for k, v in os.environ.items() if k != "TUNEPLANE_DATABASE_URL"}
    argv = [sys.executable, "-P", "-m", "tuneplane", "worker", "--backend", "slurm", "--database-url", db_url,
            "--data-dir", str(data), "--poll-interval", "0.3"]  # fmt: skip
    log = tmp_path / "worker.log"
    with open(log, "ab") as out:
        worker = subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        h.wait(lambda: db.fetch_one("SELECT count(*) AS n FROM nodes")["n"] == 2, "nodes synced")
        job_id = h.submit()
        job = h.wait_state(job_id, "succeeded", "failed", "cancelled")
        assert job["state"] == "succeeded", (job["state_reason"], log.read_text()[-2000:])
    finally:
        worker.terminate()
        assert worker.wait(30) == 0, log.read_text()[-2000:]
    # an unsupported Slurm: one line naming the version, exit status 1, no traceback
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "sinfo").write_text("#!/bin/sh\necho 'slurm 19.05.5'\n")
    (fake / "sinfo").chmod(0o755)
    refused = subprocess.run(
        argv,
        env={**env, "PATH": f"{fake}{os.pathsep}{env['PATH']}"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert refused.returncode == 1, refused
    assert "refuses to start: Slurm 19.05.5 is older than 20.11" in refused.stdout + refused.stderr
    assert "Traceback" not in refused.stdout + refused.stderr


def test_a_job_larger_than_the_partition_is_refused_at_preview(harness: Harness) -> None:
    for nodes, gpus in ((3, 1), (1, 3)):
        with pytest.raises(Refusal) as err:
            harness.submit(nodes=nodes, gpus=gpus)
        assert err.value.status == 422
        assert "fleet hpc cannot satisfy this request" in err.value.message
    with pytest.raises(Refusal) as err:
        harness.submit(nodes=1, time_limit_minutes=61)
    assert err.value.status == 422 and err.value.field == "resources.time_limit_minutes"
    assert "Slurm partition batch allows at most 60 minutes per job (MaxTime)" in err.value.message
    assert harness.db.fetch_one("SELECT count(*) AS n FROM jobs")["n"] == 0
    # within the limit: accepted, and sbatch gets it
    job_id = harness.submit(time_limit_minutes=60)
    assert harness.wait_state(job_id, "succeeded", "failed")["state"] == "succeeded"
    attempt = harness.db.fetch_one("SELECT id FROM attempts WHERE job_id = %s", (job_id,))
    assert "#SBATCH --time=60" in (harness.shared / "attempts" / str(attempt["id"]) / "batch.sh").read_text()


def test_a_waiting_job_shows_slurms_reason_and_position_and_cancel_leaves_nothing_in_squeue(
    harness: Harness,
) -> None:
    first = harness.submit(gpus=2, env={"SLEEP": "60"})
    harness.wait_state(first, "running")
    second = harness.submit(gpus=2)
    harness.wait(lambda: "reason Resources" in harness.job(second)["state_reason"], "Slurm's reason")
    job = harness.job(second)
    assert job["state"] == "queued"
    assert "reason Resources" in job["state_reason"] and "0 jobs ahead" in job["state_reason"], job
    third = harness.submit(gpus=2)
    harness.wait(lambda: "1 job ahead" in harness.job(third)["state_reason"], "position of the third job")
    pending_ids = [harness.slurm_id(second), harness.slurm_id(third)]

    # cancel while pending: nothing of it stays in squeue
    for job_id in (second, third):
        harness.db.call("cancel_job", job_id, harness.user, "test")
    harness.wait(lambda: not set(map(str, pending_ids)) & set(harness.cluster.squeue_ids()), "pending gone")
    assert harness.job(second)["state"] == "cancelled"

    # cancel while running: the job is cancelled once Slurm reports it gone
    running_id = harness.slurm_id(first)
    harness.db.call("cancel_job", first, harness.user, "test")
    job = harness.wait_state(first, "cancelled", "failed", "succeeded")
    assert job["state"] == "cancelled", job
    assert str(running_id) not in harness.cluster.squeue_ids()
    assert [m["state"] for m in harness.members(first)] == ["cancelled", "cancelled"]


def test_one_prepare_failure_aborts_and_cancels_the_slurm_job(
    db: Database, db_url: str, slurm_cluster, tmp_path: Path
) -> None:
    h = Harness(
        db, db_url, slurm_cluster, tmp_path, batch_env={"TUNEPLANE_SLURM_TEST_FAIL_PREPARE_ON": "tpn2"}
    )
    h.start()
    try:
        job_id = h.submit()
        job = h.wait_state(job_id, "failed", "succeeded", "cancelled")
        assert job["state"] == "failed"
        assert (
            "launch aborted" in job["state_reason"]
            and "rank 1 on tpn2 failed to prepare" in job["state_reason"]
        )
        attempt = db.fetch_one("SELECT * FROM attempts WHERE job_id = %s", (job_id,))
        assert attempt["state"] == "aborted"
        assert (
            db.fetch_one("SELECT decision FROM launch_decisions WHERE attempt_id = %s", (attempt["id"],))[
                "decision"
            ]
            == "abort"
        )
        # nothing of the workload ran on any node: no runner was started, no member reported started
        members_dir = h.shared / "attempts" / str(attempt["id"]) / "members"
        assert not list(members_dir.glob("*/exit_status.json"))
        assert not list((h.shared / "attempts" / str(attempt["id"]) / "reports").glob("*.started"))
        assert [m["state"] for m in h.members(job_id)] == ["aborted", "aborted"]
        h.wait(lambda: str(h.slurm_id(job_id)) not in slurm_cluster.squeue_ids(), "the Slurm job cancelled")
    finally:
        h.stop()


def test_kill_9_of_one_slurmd_fails_the_member_with_the_node_failure_and_retries(harness: Harness) -> None:
    cluster = harness.cluster
    job_id = harness.submit(env={"SLEEP": "25", "SLEEP_ON_ATTEMPT": "1"}, max_attempts=2)
    harness.wait(lambda: len([m for m in harness.members(job_id) if m["state"] == "running"]) == 2, "running")
    cluster.kill_node("tpn2")
    try:
        # The Slurm job's end is recorded member by member: wait for the attempt's own end.
        harness.wait(
            lambda: (
                harness.db.fetch_one(
                    "SELECT state FROM attempts WHERE job_id = %s AND number = 1", (job_id,)
                )["state"]
                == "failed"
            ),
            "attempt 1 failed",
            90,
        )
        first = [m for m in harness.members(job_id) if m["attempt"] == 1]
        assert all(m["state"] == "failed" for m in first), first
        assert any("node failure: Slurm reported NODE_FAIL" in m["reason"] for m in first)
        attempt = harness.db.fetch_one("SELECT * FROM attempts WHERE job_id = %s AND number = 1", (job_id,))
        assert attempt["state"] == "failed" and "NODE_FAIL" in attempt["reason"]
        harness.wait(lambda: harness.job(job_id)["state"] == "queued" or harness.slurm_id(job_id), "retry")
    finally:
        cluster.start_node("tpn2")
    job = harness.wait_state(job_id, "succeeded", "failed", "cancelled", timeout=120)
    assert job["state"] == "succeeded", job["state_reason"]
    assert "attempt 2" in job["state_reason"]
    assert any("queued for attempt 2" in e for e in harness.events(job_id))
    cluster.wait_idle(60)


def test_a_job_slurm_preempted_is_recorded_as_preempted_not_succeeded_and_runs_again(
    harness: Harness,
) -> None:
    cluster = harness.cluster
    job_id = harness.submit(gpus=2, env={"SLEEP": "60", "TRAP": "1", "SLEEP_ON_ATTEMPT": "1"})
    harness.wait(lambda: len([m for m in harness.members(job_id) if m["state"] == "running"]) == 2, "running")
    stdout = harness.shared / "attempts" / "1" / "members" / "0" / "logs" / "stdout.log"
    harness.wait(lambda: stdout.is_file() and "rank 0 of 2" in stdout.read_text(), "the workload running")
    urgent = cluster.run(
        "sbatch",
        "--parsable",
        "-p",
        "urgent",
        "-N",
        "1",
        "--gres=gpu:1",
        "-o",
        "/dev/null",
        "--wrap",
        "sleep 1",
    ).strip()
    harness.wait(
        lambda: (
            harness.db.fetch_one("SELECT state FROM attempts WHERE job_id = %s AND number = 1", (job_id,))[
                "state"
            ]
            not in ("reserved", "preparing", "running", "stopping")
        ),
        "attempt 1 ended",
        90,
    )
    attempt = harness.db.fetch_one("SELECT * FROM attempts WHERE job_id = %s AND number = 1", (job_id,))
    # Slurm's preemption (its job state PREEMPTED, or COMPLETED since the script exited 0): never failed or
    # succeeded, and it spends no attempt of max_attempts 1.
    assert attempt["state"] == "preempted", attempt["reason"]
    assert attempt["stop_kind"] == "preempted" and "preempted" in attempt["stop_cause"], attempt["stop_cause"]
    logs = (
        harness.shared / "attempts" / str(attempt["id"]) / "members" / "0" / "logs" / "stdout.log"
    ).read_text()
    assert "SIGTERM: saved, exiting 0" in logs, logs  # the workload itself exited 0
    job = harness.wait_state(job_id, "succeeded", "failed", "cancelled", timeout=90)
    assert job["state"] == "succeeded" and "attempt 2" in job["state_reason"], job["state_reason"]
    assert any("preemptions do not count against max_attempts" in e for e in harness.events(job_id))
    harness.wait(lambda: urgent not in cluster.squeue_ids(), "the urgent job done")


def test_a_member_that_starts_2s_after_the_other_makes_the_attempt_running_only_then(
    db: Database, db_url: str, slurm_cluster, tmp_path: Path
) -> None:
    """`running` means every member started (member_now_running, the Node backend's rule too): with rank 1's
    runner started 2 s after rank 0's, no moment shows the attempt running with one member started."""
    from tuneplane.workers.slurm.step import DELAY_START_ENV

    h = Harness(db, db_url, slurm_cluster, tmp_path, batch_env={DELAY_START_ENV: "tpn2:2"})
    h.start()
    try:
        job_id = h.submit(env={"SLEEP": "3"})
        seen: list[tuple[int, bool]] = []

        def both_started() -> bool:
            row = db.fetch_one(
                "SELECT a.running_at IS NOT NULL AS running, (SELECT count(*) FROM members m"
                "        WHERE m.attempt_id = a.id AND m.started_at IS NOT NULL) AS started"
                "  FROM attempts a WHERE a.job_id = %s",
                (job_id,),
            )
            if row:
                seen.append((row["started"], row["running"]))
            return bool(row) and row["started"] == 2

        h.wait(both_started, "both members started", 90)
        assert (1, False) in seen  # the window was observed: one started, the attempt not running
        assert (1, True) not in seen and (0, True) not in seen
        job = h.wait_state(job_id, "succeeded", "failed", "cancelled", timeout=90)
        assert job["state"] == "succeeded", job["state_reason"]
        members = h.members(job_id)
        first, last = sorted(m["started_at"] for m in members)
        assert (last - first).total_seconds() >= 1.5  # the 2 s hook held rank 1 back
        attempt = db.fetch_one("SELECT running_at FROM attempts WHERE job_id = %s", (job_id,))
        assert attempt["running_at"] >= last
        assert "attempt 1: all 2 member(s) running" in h.events(job_id)
    finally:
        h.stop()
        slurm_cluster.run("scancel", "--full", "-u", "root", check=False)


def test_controller_stopped_during_a_run_marks_members_contact_lost_and_the_job_completes(
    harness: Harness,
) -> None:
    cluster = harness.cluster
    job_id = harness.submit(env={"SLEEP": "8"})
    harness.wait(lambda: len([m for m in harness.members(job_id) if m["state"] == "running"]) == 2, "running")
    cluster.stop_controller()
    stopped = time.monotonic()
    try:
        harness.wait(
            lambda: all(m["contact_lost_at"] is not None for m in harness.members(job_id)), "contact lost", 30
        )
        members = harness.members(job_id)
        assert [m["state"] for m in members] == ["running", "running"]
        assert all(m["released_at"] is None for m in members)
        fleet = harness.db.fetch_one("SELECT reachable, last_error FROM slurm_fleets")
        assert fleet["reachable"] is False and fleet["last_error"]
        # The controller stays away 20 s, past the workload's end (8 s): nothing may be decided meanwhile.
        time.sleep(max(0.0, 20.0 - (time.monotonic() - stopped)))
        assert harness.job(job_id)["state"] == "running"
        assert all(m["state"] == "running" for m in harness.members(job_id))
    finally:
        cluster.start_controller()
    job = harness.wait_state(job_id, "succeeded", "failed", "cancelled", timeout=90)
    assert job["state"] == "succeeded", job["state_reason"]
    assert all(m["contact_lost_at"] is None for m in harness.members(job_id))
    # Slurm itself keeps the job COMPLETING for about a minute after such a restart (the completion its slurmd
    # sent while the controller was away is retried): this test runs last so that nobody waits for it.
