"""`launch_latency.py --backend slurm`: TunePlane on Slurm against raw `sbatch … srun`, in interleaved pairs.

Starts the test suite's private Slurm cluster (tests/slurm_cluster.py: one slurmctld, two slurmd virtual
nodes on this machine), an embedded PostgreSQL, and `tuneplane worker --backend slurm` as its own process
with its default 1-second pass. Each pair runs, in alternating order:
  raw        `sbatch --nodes=2 … --wrap 'srun … date'`: from the sbatch call to the later of the two tasks'
             start times (each task writes `date +%s.%N`);
  TunePlane  the same 2-node gang job confirmed through the service: from the confirmation (jobs.created_at)
             to the attempt running, every member started (attempts.running_at).
Both clocks are this machine's. The next run starts only once Slurm lists no job (an idle cluster).
Stages of the TunePlane run: confirm → sbatch (slurm_jobs.submitted_at) → allocation recorded
(slurm_jobs.started_at) → COMMIT (attempts.committed_at) → all running (attempts.running_at).
--trace: per pair, the files the batch script, the steps and the worker write in the attempt's directory
(their modification times, after the allocation was recorded): `reports/allocated` (the batch script
began), `plan.json` (the worker recorded the allocation), the last `<rank>.prepared`, `decision` (the worker
wrote the recorded COMMIT), the last `<rank>.started`.
"""

from __future__ import annotations

import hashlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

from launch_latency import percentile, poll

REPO = Path(__file__).resolve().parents[1]
MAIN = "import sys\nsys.exit(0)\n"
STAGES = [
    ("sbatch", "created_at", "submitted_at"),
    ("allocation", "submitted_at", "allocated_at"),
    ("commit", "allocated_at", "committed_at"),
    ("running", "committed_at", "running_at"),
]
TIMES = """
SELECT j.state, j.state_reason, j.created_at, a.id AS attempt_id, s.submitted_at,
       s.started_at AS allocated_at, a.committed_at, a.running_at,
       (SELECT max(m.started_at) - min(m.started_at) FROM tuneplane.members m
         WHERE m.attempt_id = a.id) AS skew
  FROM tuneplane.jobs j
  LEFT JOIN tuneplane.attempts a ON a.job_id = j.id AND a.number = 1
  LEFT JOIN tuneplane.slurm_jobs s ON s.attempt_id = a.id
 WHERE j.id = %s
"""


def raw_run(cluster, work: Path, index: int, timeout: float) -> float:
    """Seconds from the sbatch call to both tasks started."""
    out = work / f"raw{index}"
    out.mkdir()
    task = f"date +%s.%N > {out}/started.$SLURM_NODEID"
    wrap = f"srun --nodes=2 --ntasks=2 --ntasks-per-node=1 bash -c '{task}'"
    argv = ["sbatch", "--parsable", "--nodes=2", "--ntasks-per-node=1", "--cpus-per-task=1", "--gres=gpu:1",
            "--partition=batch", f"--output={out}/batch.log", "--no-requeue", "--wrap", wrap]  # fmt: skip
    began = time.time()
    subprocess.run(argv, env=cluster.env, check=True, capture_output=True, timeout=30)
    files = [out / "started.0", out / "started.1"]

    def started() -> bool:
        return all(f.is_file() and f.read_text().strip() for f in files)

    if not poll(started, timeout):
        raise SystemExit(f"raw Slurm job {index} did not start in {timeout:.0f}s; see {out}")
    return max(float(f.read_text()) for f in files) - began


# (label, the file in the attempt's directory; a glob takes the latest of its matches)
TRACE_FILES = [
    ("allocated", "reports/allocated"),
    ("plan", "plan.json"),
    ("prepared", "reports/*.prepared"),
    ("decision", "decision"),
    ("started", "reports/*.started"),
]


def file_times(directory: Path, allocated_at: float) -> dict[str, float]:
    """Each TRACE_FILES file's modification time after the allocation was recorded (seconds; NaN if none)."""
    times = {}
    for label, pattern in TRACE_FILES:
        found = [f.stat().st_mtime for f in directory.glob(pattern)]
        times[label] = max(found) - allocated_at if found else float("nan")
    return times


def main(args) -> int:
    sys.path.insert(0, str(REPO))
    from tests.e2e.launch_cluster import source_archive
    from tests.slurm_cluster import missing_binaries, started_cluster
    from tests.submission_setup import add_user
    from tuneplane.app import embedded_pg
    from tuneplane.app.blobstore import FilesystemBlobStore
    from tuneplane.app.db import Database
    from tuneplane.app.migrate import migrate
    from tuneplane.app.submission import service

    if missing_binaries():
        raise SystemExit(f"Slurm binaries missing: {missing_binaries()}")
    root = Path(tempfile.mkdtemp(prefix="tp-launch-slurm-"))
    os.chmod(root, 0o755)
    print(f"installation in {root}; load average {Path('/proc/loadavg').read_text().split()[:3]}", flush=True)
    clusters = started_cluster(2)
    cluster = next(clusters)
    pg = embedded_pg.start(root / "pg")
    worker = None
    try:
        migrate(pg.url, progress=lambda _line: None)
        db = Database(pg.url, max_size=2, name="bench")
        user = add_user(db, "bench")
        shared = cluster.shared / "bench"
        shared.mkdir(parents=True)
        db.call(
            "create_slurm_fleet", "hpc", "batch", str(cluster.conf), json.dumps({"shared_path": str(shared)})
        )
        data = root / "data"
        blobs = FilesystemBlobStore(data / "blobs")
        archive = source_archive({"main.py": MAIN})
        sha = hashlib.sha256(archive).hexdigest()
        with blobs.stage() as (staged, handle):
            handle.write(archive)
            handle.flush()
            blobs.commit_staged(staged, sha)
        db.call("record_source_archive", user, sha, len(archive), 1, len(MAIN))
        env = {k: v for k, v in os.environ.items() if k != "TUNEPLANE_DATABASE_URL"}
        env["PYTHONPATH"] = str(REPO)
        log = open(root / "worker.log", "ab")  # noqa: SIM115 - closed below
        worker = subprocess.Popen(
            [
                sys.executable,
                "-P",
                "-m",
                "tuneplane",
                "worker",
                "--backend",
                "slurm",
                "--database-url",
                pg.url,
                "--data-dir",
                str(data),
            ],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        if not poll(lambda: db.fetch_one("SELECT count(*) AS n FROM tuneplane.nodes")["n"] == 2, 60, 0.2):
            raise SystemExit(f"the Slurm worker never synced the nodes; see {root / 'worker.log'}")
        spec = {
            "source": {"archive": f"sha256:{sha}", "entrypoint": "python main.py"},
            "resources": {"nodes": 2, "gpus_per_node": 1, "cpus_per_node": 1},
            "fleet": "hpc",
        }

        def idle() -> bool:
            return not cluster.squeue_ids()

        def tuneplane_run(index: int) -> dict:
            preview = service.create_preview(db, user, spec)
            job_id = service.confirm(db, user, preview["id"], preview["digest"], uuid.uuid4().hex)["job_id"]

            def row():
                return db.fetch_one(TIMES, (job_id,))

            def started_or_ended() -> bool:
                current = row()
                return current["running_at"] is not None or current["state"] in ("failed", "cancelled")

            if not poll(started_or_ended, args.timeout):
                raise SystemExit(f"TunePlane job {job_id} did not run in {args.timeout:.0f}s; see {root}")
            current = row()
            if current["running_at"] is None:
                raise SystemExit(f"TunePlane job {job_id} {current['state']}: {current['state_reason']}")
            poll(lambda: row()["state"] in ("succeeded", "failed", "cancelled"), args.timeout, 0.05)
            result = {"latency": (current["running_at"] - current["created_at"]).total_seconds()}
            for label, start, stop in STAGES:
                result[label] = (current[stop] - current[start]).total_seconds()
            result["skew"] = current["skew"].total_seconds() if current["skew"] is not None else 0.0
            if args.trace:
                directory = shared / "attempts" / str(current["attempt_id"])
                result["files"] = file_times(directory, current["allocated_at"].timestamp())
                committed = (current["committed_at"] - current["allocated_at"]).total_seconds()
                result["files"]["COMMIT"] = committed
            return result

        pairs = []
        for i in range(args.warmup + args.runs):
            order = ("raw", "tp") if i % 2 == 0 else ("tp", "raw")
            pair: dict = {}
            for kind in order:
                if not poll(idle, 60, 0.05):
                    raise SystemExit("the cluster did not become idle between runs")
                if kind == "raw":
                    pair["raw"] = raw_run(cluster, root, i, args.timeout)
                else:
                    pair["tp"] = tuneplane_run(i)
            label = "warmup" if i < args.warmup else f"pair {i - args.warmup + 1:>3}"
            tp = pair["tp"]
            stages = ", ".join(f"{name} {tp[name] * 1000:.0f}" for name, _a, _b in STAGES)
            print(
                f"{label} ({'/'.join(order)}): raw {pair['raw']:.3f} s, TunePlane {tp['latency']:.3f} s "
                f"({stages} ms; start skew {tp['skew'] * 1000:.0f} ms), difference "
                f"{tp['latency'] - pair['raw']:+.3f} s",
                flush=True,
            )
            if args.trace:
                order_ = sorted(tp["files"].items(), key=lambda kv: kv[1])
                print("    after the allocation was recorded: "
                      + ", ".join(f"{k} {v * 1000:+.0f}" for k, v in order_) + " ms", flush=True)  # fmt: skip
            if i >= args.warmup:
                pairs.append(pair)
        raw = [p["raw"] for p in pairs]
        tp = [p["tp"]["latency"] for p in pairs]
        diff = [p["tp"]["latency"] - p["raw"] for p in pairs]

        print(f"\n2-member gang job, {len(pairs)} interleaved pairs on the private 2-node Slurm cluster:")
        print(
            f"  raw sbatch … srun → both tasks started: median {statistics.median(raw):.3f} s, "
            f"p90 {percentile(raw, 0.9):.3f} s"
        )
        print(
            f"  TunePlane confirm → all members running: median {statistics.median(tp):.3f} s, "
            f"p90 {percentile(tp, 0.9):.3f} s"
        )
        for name, _a, _b in STAGES:
            print(f"    {name:<10} median {statistics.median(p['tp'][name] for p in pairs) * 1000:7.0f} ms")
        if args.trace:
            labels = [label for label, _ in TRACE_FILES] + ["COMMIT"]
            medians = {k: statistics.median(p["tp"]["files"][k] for p in pairs) for k in labels}
            ordered = sorted(medians.items(), key=lambda kv: kv[1])
            print("    files after the allocation was recorded (medians): "
                  + ", ".join(f"{k} {v * 1000:+.0f}" for k, v in ordered) + " ms")  # fmt: skip
        print(
            f"  per-pair difference TunePlane − raw: median {statistics.median(diff):+.3f} s, "
            f"p90 {percentile(diff, 0.9):+.3f} s (target ≤ +0.5 s); ratio of medians "
            f"{statistics.median(tp) / statistics.median(raw):.2f}×"
        )
        print(f"  load average at the end: {Path('/proc/loadavg').read_text().split()[:3]}")
        db.close()
    finally:
        if worker is not None:
            worker.terminate()
            try:
                worker.wait(30)
            except subprocess.TimeoutExpired:
                worker.kill()
        pg.stop()
        try:
            next(clusters)
        except StopIteration:
            pass
        if not args.keep:
            import shutil

            shutil.rmtree(root, ignore_errors=True)
        else:
            print(f"kept {root}")
    return 0
