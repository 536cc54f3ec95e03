"""`bench/artifacts_throughput.py --store s3`: direct delivery to an S3 store next to a plain multipart
upload of the same bytes to the same store with the same client (boto3), in one run (issue 32).

Starts an embedded PostgreSQL, a real SeaweedFS (`weed server -s3`, tests/seaweed_store.py) and a real
`tuneplane node-gateway` holding the store's credentials (its environment), and gives the fleet that store.
Each round writes a directory of random files and measures:

- plain: boto3 `upload_file` of every file (multipart, parts of --part-mib, 4 parts at a time), the
  baseline of what this store takes on this machine;
- delivery: what the agent does (`deliver_artifact` through the gateway: manifest, registration, parts to
  presigned URLs, the server's completion and its own sha256 of every object) until `complete`;
- its upload, measured inside the delivery: from the first part's PUT to the store until the last part's
  answer (the node's checksums, the presign calls and the server's verification of earlier files overlap
  it, and count); after it, the verification tail (the last files' completion and sha256 until
  `complete`); before it, the manifest (the node's sha256 pass) and registration;
- apart, for reference: the server's verification alone (one streaming sha256 of every object from the
  store, as the verifier does it), which the delivery overlaps with its upload.

It prints the ratios the issue asks about (upload ≥ 0.8 of the plain upload's throughput; time to complete
≤ 1.5× the plain upload) and the gateway's CPU-seconds per GiB (from /proc: what the server side spends,
nearly all of it the verifier's sha256).

Run: .venv/bin/python bench/artifacts_throughput.py --store s3 [--mib 1024] [--files 4] [--rounds 1]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main(argv: list[str]) -> None:
    from boto3.s3.transfer import TransferConfig
    from psycopg.types.json import Jsonb

    from bench.artifacts_throughput import start, write_random_tree
    from tests.artifact_fixtures import make_member
    from tests.conftest import free_port
    from tests.seaweed_store import ACCESS_KEY, BUCKET, SECRET_KEY, SeaweedStore, object_keys
    from tuneplane.app import embedded_pg
    from tuneplane.app.db import Database
    from tuneplane.app.migrate import migrate
    from tuneplane.app.s3store import S3Credentials, S3Location, S3Store
    from tuneplane.workers.artifacts import s3_upload
    from tuneplane.workers.artifacts.deliver import deliver_artifact, node_http
    from tuneplane.workers.artifacts.manifest import build_manifest

    parser = argparse.ArgumentParser(prog="artifacts_throughput.py --store s3")
    parser.add_argument("--store", choices=["s3"], default="s3")
    parser.add_argument("--mib", type=int, default=1024, help="total artifact size")
    parser.add_argument("--files", type=int, default=4)
    parser.add_argument("--part-mib", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=1)
    args = parser.parse_args(argv)
    total = args.mib * 2**20
    keys = ("plain", "deliver", "manifest", "verify", "cpu", "upload", "before", "tail")
    times: dict[str, list[float]] = {k: [] for k in keys}
    # (start, end) of every part PUT to the store during a delivery (the agent's HTTP client, this process).
    puts: list[tuple[float, float]] = []
    real_put = s3_upload.put_part

    def timed_put(pool, url, data, headers):
        start = time.perf_counter()
        try:
            return real_put(pool, url, data, headers)
        finally:
            puts.append((start, time.perf_counter()))

    s3_upload.put_part = timed_put  # the agent's part PUT, timed (it runs in this process)
    with tempfile.TemporaryDirectory(prefix="tp-bench-s3-", dir=REPO) as tmp_name:
        tmp = Path(tmp_name)
        seaweed = SeaweedStore(tmp / "seaweed")
        pg = embedded_pg.start(tmp / "pg")
        gateway_process = None
        try:
            seaweed.start()
            migrate(pg.url, progress=lambda _m: None)
            db = Database(pg.url, max_size=4)
            setup = make_member(db)
            storage = {"kind": "s3", "bucket": BUCKET, "prefix": "bench", "endpoint": seaweed.endpoint}
            db.call("set_fleet_storage", "gpu", Jsonb(storage), "bench")
            store = S3Store(
                S3Location(seaweed.endpoint, BUCKET, "bench"), S3Credentials(ACCESS_KEY, SECRET_KEY)
            )
            os.environ["TUNEPLANE_S3_ACCESS_KEY_ID"] = ACCESS_KEY  # the gateway's; never the node's
            os.environ["TUNEPLANE_S3_SECRET_ACCESS_KEY"] = SECRET_KEY
            port = free_port()
            gateway = f"http://127.0.0.1:{port}"
            common = ["--database-url", pg.url, "--data-dir", str(tmp / "data")]
            gateway_process = start(["node-gateway", "--port", str(port), *common], gateway, "/healthz")
            client = seaweed.client()
            config = TransferConfig(multipart_threshold=8 * 2**20, multipart_chunksize=args.part_mib * 2**20,
                                    max_concurrency=4)  # fmt: skip
            for round_no in range(args.rounds):
                src = tmp / f"src-{round_no}"
                write_random_tree(src, args.files, total)
                begin = time.perf_counter()
                for path in sorted(src.rglob("*")):
                    if path.is_file():
                        client.upload_file(str(path), BUCKET, f"plain/{round_no}/{path.name}", Config=config)
                times["plain"].append(time.perf_counter() - begin)

                begin = time.perf_counter()
                manifest = build_manifest(src)
                times["manifest"].append(time.perf_counter() - begin)

                cpu = _cpu_seconds(gateway_process.pid)
                puts.clear()
                with node_http(gateway, setup.credential, timeout=600) as http:
                    begin = time.perf_counter()
                    art = deliver_artifact(
                        http, setup.member["id"], f"bench-{round_no}", src, kind="checkpoint"
                    )
                    end = time.perf_counter()
                times["deliver"].append(end - begin)
                times["cpu"].append(_cpu_seconds(gateway_process.pid) - cpu)
                first_put, last_put = min(p[0] for p in puts), max(p[1] for p in puts)
                times["upload"].append(last_put - first_put)
                times["before"].append(first_put - begin)
                times["tail"].append(end - last_put)
                assert art["state"] == "complete", art

                begin = time.perf_counter()
                keys = object_keys(db, store, art["id"])  # where the server verified them
                for entry in manifest.files:
                    assert store.verify(keys[entry.path], entry.sha256, entry.size)
                times["verify"].append(time.perf_counter() - begin)
                assert not (tmp / "data").exists() or not [
                    p for p in (tmp / "data").rglob("sha256/*/*") if p.is_file()
                ], "bytes reached the server's blob directory"
                shutil.rmtree(src)
        finally:
            if gateway_process is not None:
                gateway_process.terminate()
                gateway_process.wait(timeout=10)
            seaweed.kill()
            pg.stop()

    median = {k: statistics.median(v) for k, v in times.items()}
    gib = total / 2**30
    print(
        f"artifact of {args.files} files, {args.mib} MiB, parts of {args.part_mib} MiB, SeaweedFS on "
        f"loopback, {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}, "
        f"median of {args.rounds} round(s)"
    )
    rows = [
        ("plain multipart upload (boto3)", median["plain"]),
        ("delivery → complete (all of it)", median["deliver"]),
        ("  before the first part (manifest, register)", median["before"]),
        ("  upload (first part PUT → last part answer)", median["upload"]),
        ("  verification tail (last part → complete)", median["tail"]),
        ("manifest alone (the node's sha256 pass)", median["manifest"]),
        ("server verification alone (GET + sha256)", median["verify"]),
    ]
    for label, seconds in rows:
        print(f"  {label:<46} {seconds:7.2f} s  {args.mib / seconds:8.1f} MiB/s")
    for name in ("plain", "deliver", "upload"):
        print(f"  rounds {name}: " + ", ".join(f"{t:.2f}" for t in times[name]))
    print(f"ratio upload/plain throughput: {median['plain'] / median['upload']:.2f} (target ≥ 0.8)")
    print(f"time to complete / plain upload: {median['deliver'] / median['plain']:.2f} (target ≤ 1.5)")
    print(f"gateway CPU-seconds per GiB delivered: {median['cpu'] / gib:.2f} (nearly all its sha256)")
