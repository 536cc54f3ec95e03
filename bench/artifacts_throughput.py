"""Artifact delivery throughput next to a plain file copy of the same bytes, on this machine, in one run.

Starts an embedded PostgreSQL, a real `tuneplane server` and a real `tuneplane node-gateway` (one data
directory, one blob store). For each round it writes a directory of random files, then measures:

- plain copy: shutil.copyfile of every file + fsync (the baseline);
- upload + verify: what an agent does when a member ends (`deliver_artifact` through the node gateway:
  manifest, registration, chunks, the server's own sha256 of every file) until the artifact is `complete`;
- verified download: what `tuneplane artifacts download` does through the server (every file hashed
  while it is written, moved into place only if it matches).

The machine is shared, so it runs several rounds and reports the median of each; the ratio is the
throughput of the operation over the throughput of the copy (1.0 = as fast as the copy). Target: ≥ 0.5.

Each timed operation starts from the same page-cache state: on this VM, writing 256 MiB into the page
cache costs ~0.065 s right after as many bytes of page cache were freed (a file deleted) and ~0.65 s
otherwise (measured: the same pwrite loop, or copyfile, either way), so whichever phase happened to follow
the previous round's deletions ran 10x faster on its writes. Before each timed operation the bench writes
and deletes a scratch file of twice the artifact's size (once its size still left some rounds' downloads
on the slow path: 0.44 s against 0.30 s, the profile all in the page-cache copy) and syncs (untimed);
`--no-level` turns that off.

It also prints floors measured in the same run: one sha256 pass over every file (files hashed in
parallel threads, from the page cache); moving the same number of bytes over loopback TCP with bare
sockets (as many connections as files; no HTTP, disk or hashing) — verified download cannot beat it; and
the upload's own work with nothing of HTTP or the database (`bare_upload`: the manifest, then each file's
chunks in order over bare sockets, files in parallel, read in 1 MiB pieces with their crc32c, checked,
hashed, written, written back and fsynced by a receiver in another process, as the node gateway is) — what
this design could reach on this machine with an ideal transport — and the same with the agent's sha256
computed while it sends instead of in a pass before, and with no agent sha256 at all: the floors of the
two other designs (docs/artifacts.md, Measured).

Run: .venv/bin/python bench/artifacts_throughput.py [--mib 256] [--files 4] [--chunk-mib 32] [--rounds 3]
     [--no-level]
     .venv/bin/python bench/artifacts_throughput.py --store s3 [--mib 1024]: direct delivery to an S3 store
     next to a plain multipart upload (bench/artifacts_s3.py)
"""

from __future__ import annotations

import argparse
import hashlib
import multiprocessing
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import google_crc32c  # noqa: E402
import httpx  # noqa: E402

from tests.artifact_fixtures import api_token, make_member  # noqa: E402
from tests.conftest import free_port  # noqa: E402
from tests.helpers import wait_for  # noqa: E402
from tuneplane.app import embedded_pg  # noqa: E402
from tuneplane.app.cli.artifacts_cmd import download_artifact  # noqa: E402
from tuneplane.app.client.config import ClientConfig  # noqa: E402
from tuneplane.app.client.http import ApiClient  # noqa: E402
from tuneplane.app.components import tuneplane_argv  # noqa: E402
from tuneplane.app.db import Database  # noqa: E402
from tuneplane.app.migrate import migrate  # noqa: E402
from tuneplane.workers.artifacts.deliver import deliver_artifact, node_http  # noqa: E402
from tuneplane.workers.artifacts.manifest import build_manifest  # noqa: E402
from tuneplane.workers.artifacts.upload import Chunk, read_chunk  # noqa: E402

TARGET = 0.5


def fsync_tree(root: Path) -> None:
    for path in root.rglob("*"):
        if path.is_file():
            with open(path, "rb") as handle:
                os.fsync(handle.fileno())


def plain_copy(src: Path, dst: Path) -> None:
    for path in sorted(src.rglob("*")):
        if path.is_file():
            target = dst / path.relative_to(src)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, target)
    fsync_tree(dst)


def level_page_cache(scratch: Path, total: int) -> None:
    """Write and delete `total` bytes of page cache, then sync, so the next timed operation starts from
    the same page-cache state as every other (see the module docstring)."""
    block = bytes(8 * 1024 * 1024)
    fd = os.open(scratch, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        for offset in range(0, total, len(block)):
            os.pwrite(fd, block, offset)
    finally:
        os.close(fd)
    scratch.unlink()
    os.sync()


def loopback_transfer(total: int, streams: int) -> float:
    """Seconds to move `total` bytes over loopback TCP in `streams` parallel connections with bare sockets
    (sendall of a 4 MiB buffer, recv_into another; no HTTP, no disk, no hashing)."""
    block = memoryview(bytearray(4 * 1024 * 1024))
    per_stream = total // streams
    listener = socket.create_server(("127.0.0.1", 0))

    def receive(conn: socket.socket) -> None:
        buffer = memoryview(bytearray(len(block)))
        with conn:
            while conn.recv_into(buffer):
                pass

    def send(_i: int) -> None:
        with socket.create_connection(listener.getsockname()) as conn:
            for offset in range(0, per_stream, len(block)):
                conn.sendall(block[: min(len(block), per_stream - offset)])

    with listener, ThreadPoolExecutor(2 * streams) as pool:
        begin = time.perf_counter()
        receivers = []
        senders = [pool.submit(send, i) for i in range(streams)]
        for _ in range(streams):
            receivers.append(pool.submit(receive, listener.accept()[0]))
        for future in senders + receivers:
            future.result()
        return time.perf_counter() - begin


# How the agent treats the bytes in `bare_upload`: the present design (a manifest pass, then chunks with
# their crc32c), the agent's sha256 computed while it sends instead of in a pass before (no registration
# before the last byte is read), and no agent sha256 at all (the server's hash would be the manifest's).
AGENT_MODES = ("manifest", "overlap", "server_only")


def _bare_receiver(dst: Path, sizes: dict[str, int], chunk_size: int, ports: Any) -> None:
    """The receiving side of `bare_upload`, in its own process (as the node gateway is): for each chunk,
    check the crc32c, extend the file's sha256, write at the offset, start writeback, fsync after the
    file's last chunk, then answer with the crc32c."""
    from tuneplane.app.artifacts.staged_hash import start_writeback

    hashes = {name: hashlib.sha256() for name in sizes}
    listener = socket.create_server(("127.0.0.1", 0))
    ports.put(listener.getsockname()[1])

    def receive(conn: socket.socket) -> None:
        with conn, conn.makefile("rb") as stream:
            name, index = stream.readline().decode().split()
            size, offset = sizes[name], int(index) * chunk_size
            length, crc, got = min(chunk_size, size - offset), 0, 0
            fd = os.open(dst / name, os.O_WRONLY | os.O_CREAT, 0o600)
            try:
                while got < length:
                    block = stream.read1(min(4 * 1024 * 1024, length - got))
                    crc = google_crc32c.extend(crc, block)
                    hashes[name].update(block)
                    os.pwrite(fd, block, offset + got)
                    start_writeback(fd, offset + got, len(block))
                    got += len(block)
                if offset + length == size:
                    os.fsync(fd)
            finally:
                os.close(fd)
            conn.sendall(f"{crc:08x}".encode())

    with listener, ThreadPoolExecutor(2 * len(sizes)) as receivers:
        for _ in range(sum(-(-size // chunk_size) for size in sizes.values())):
            receivers.submit(receive, listener.accept()[0])


def bare_upload(src: Path, dst: Path, chunk_size: int, agent: str = "manifest") -> float:
    """Seconds for the upload's own work with nothing of HTTP, aiohttp or the database: every file's chunks
    in order over bare loopback sockets (files in parallel) to a receiver in another process, the agent
    reading each in 1 MiB pieces with their crc32c; `agent` (AGENT_MODES) says where the agent's sha256 is
    computed: in a manifest pass first (today), while sending, or nowhere. Until the last file is fsynced."""
    dst.mkdir(parents=True)
    sizes = {p.name: p.stat().st_size for p in src.iterdir()}
    context = multiprocessing.get_context("spawn")
    ports = context.Queue()
    receiver = context.Process(target=_bare_receiver, args=(dst, sizes, chunk_size, ports))
    receiver.start()
    address = ("127.0.0.1", ports.get(timeout=60))

    def send_file(name: str) -> None:
        digest = hashlib.sha256() if agent == "overlap" else None
        for offset in range(0, sizes[name], chunk_size):
            chunk = Chunk(offset // chunk_size, offset, min(chunk_size, sizes[name] - offset))
            pieces, crc = read_chunk(src / name, chunk)
            with socket.create_connection(address) as conn:
                conn.sendall(f"{name} {chunk.index}\n".encode())
                for piece in pieces:
                    if digest is not None:
                        digest.update(piece)
                    conn.sendall(piece)
                assert conn.recv(8).decode() == crc

    try:
        with ThreadPoolExecutor(len(sizes)) as pool:
            begin = time.perf_counter()
            if agent == "manifest":
                build_manifest(src)
            for future in [pool.submit(send_file, name) for name in sizes]:
                future.result()
            return time.perf_counter() - begin
    finally:
        receiver.join(timeout=60)


def sha256_pass(root: Path) -> float:
    """Seconds for one sha256 pass over every file under root, files in parallel (as the manifest does)."""
    begin = time.perf_counter()
    build_manifest(root)
    return time.perf_counter() - begin


def write_random_tree(root: Path, files: int, total: int) -> None:
    root.mkdir(parents=True)
    per_file = total // files
    block = os.urandom(1024 * 1024)
    for i in range(files):
        with open(root / f"shard-{i:02d}.bin", "wb") as handle:
            for _ in range(0, per_file, len(block)):
                # Distinct bytes per file and block (no two files share a blob), cheaply.
                handle.write(os.urandom(32) + block[32:])
        os.sync()


def start(args: list[str], url: str, health: str) -> subprocess.Popen:
    process = subprocess.Popen(
        tuneplane_argv(*args), cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    wait_for(lambda: _up(url + health), timeout=60, what=" ".join(args[:1]))
    return process


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mib", type=int, default=256, help="total artifact size")
    parser.add_argument("--files", type=int, default=4)
    parser.add_argument("--chunk-mib", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--upload-via",
        choices=["gateway", "server"],
        default="gateway",
        help="where the upload goes: the node gateway (what agents use) or the console server",
    )
    parser.add_argument(
        "--no-level", action="store_true", help="do not level the page cache before each timed operation"
    )
    args = parser.parse_args()
    total = args.mib * 1024 * 1024
    phases = ("copy", "upload", "verify", "download", "sha256", "transfer", *AGENT_MODES)
    times: dict[str, list[float]] = {phase: [] for phase in phases}
    with tempfile.TemporaryDirectory(prefix="tp-bench-artifacts-", dir=REPO) as tmp_name:
        tmp = Path(tmp_name)
        pg = embedded_pg.start(tmp / "pg")
        processes: list[subprocess.Popen] = []
        try:
            migrate(pg.url, progress=lambda _m: None)
            db = Database(pg.url, max_size=4)
            db.fetch_one(
                "UPDATE artifact_settings SET chunk_size = %s RETURNING 1", (args.chunk_mib * 1024 * 1024,)
            )
            setup = make_member(db)
            token = api_token(db, setup.user_id)
            common = ["--database-url", pg.url, "--data-dir", str(tmp / "data")]
            server_port, gateway_port = free_port(), free_port()
            server = f"http://127.0.0.1:{server_port}"
            gateway = f"http://127.0.0.1:{gateway_port}"
            processes.append(start(["server", "--port", str(server_port), *common], server, "/healthz"))
            processes.append(
                start(["node-gateway", "--port", str(gateway_port), *common], gateway, "/healthz")
            )
            api = ApiClient(ClientConfig(server, token), timeout=600)
            user = httpx.Client(
                base_url=server,
                headers={"Authorization": f"Bearer {token}", "Accept": "application/json"},
                timeout=600,
            )

            def level() -> None:
                if not args.no_level:
                    level_page_cache(tmp / "scratch", 2 * total)

            for round_no in range(args.rounds):
                src = tmp / f"src-{round_no}"
                write_random_tree(src, args.files, total)
                times["sha256"].append(sha256_pass(src))
                times["transfer"].append(loopback_transfer(total, args.files))
                for mode in AGENT_MODES:
                    level()
                    seconds = bare_upload(src, tmp / f"bare-{round_no}", args.chunk_mib * 2**20, mode)
                    times[mode].append(seconds)
                    shutil.rmtree(tmp / f"bare-{round_no}")

                level()
                begin = time.perf_counter()
                plain_copy(src, tmp / f"copy-{round_no}")
                times["copy"].append(time.perf_counter() - begin)

                target = gateway if args.upload_via == "gateway" else server
                level()
                with node_http(target, setup.credential, timeout=600) as http:
                    begin = time.perf_counter()
                    art = deliver_artifact(http, setup.member["id"], f"bench-{round_no}", src)
                    times["upload"].append(time.perf_counter() - begin)
                assert art["state"] == "complete", art

                begin = time.perf_counter()
                report = user.post(f"/artifacts/{art['id']}/verify").json()
                times["verify"].append(time.perf_counter() - begin)
                assert report["ok"], report

                artifact = api.get(f"/artifacts/{art['id']}")
                level()
                begin = time.perf_counter()
                _total, problems = download_artifact(api, artifact, tmp / f"download-{round_no}")
                fsync_tree(tmp / f"download-{round_no}")
                times["download"].append(time.perf_counter() - begin)
                assert not problems, problems
                for done in (src, tmp / f"copy-{round_no}", tmp / f"download-{round_no}"):
                    shutil.rmtree(done)
            api.close()
            user.close()
        finally:
            for process in processes:
                process.terminate()
                process.wait(timeout=10)
            pg.stop()

    mib = total / 2**20
    median = {k: statistics.median(v) for k, v in times.items()}
    print(
        f"artifact of {args.files} files, {mib:.0f} MiB, chunks of {args.chunk_mib} MiB, on {os.cpu_count()} "
        f"CPUs, median of {args.rounds} rounds, upload via the {args.upload_via}, page cache "
        f"{'not levelled' if args.no_level else 'levelled before each timed operation'}"
    )
    rows = [
        ("plain copy (copyfile + fsync)", "copy"),
        ("upload + server verification → complete", "upload"),
        ("server verify (recompute every file)", "verify"),
        ("verified download (+ fsync)", "download"),
        ("floor: one sha256 pass over every file", "sha256"),
        ("floor: bare loopback transfer (no HTTP)", "transfer"),
        ("floor: upload's work over bare sockets", "manifest"),
        ("  … agent's sha256 while sending instead", "overlap"),
        ("  … no agent sha256 (server's hash only)", "server_only"),
    ]
    for label, key in rows:
        seconds = median[key]
        share = median["copy"] / seconds
        print(f"  {label:<42} {seconds:7.2f} s  {mib / seconds:8.1f} MiB/s  ({share:.2f} of the copy)")
    # Upload cannot send a byte before the manifest (a sha256 pass) is registered, and then every byte
    # crosses the loopback; download's hashing overlaps its transfer.
    floors = {
        "upload": ("its own work over bare sockets", median["manifest"]),
        "download": ("the bare transfer", median["transfer"]),
    }
    for key, (what, floor) in floors.items():
        ratio = median["copy"] / median[key]
        verdict = "ok" if ratio >= TARGET else "BELOW TARGET"
        print(
            f"ratio {key}/copy throughput: {ratio:.2f} (target ≥ {TARGET}) {verdict}; "
            f"{what} alone would be {median['copy'] / floor:.2f}"
        )
    print(
        "upload floors of other designs: the agent's sha256 while it sends (registration before the last "
        f"byte is read) {median['copy'] / median['overlap']:.2f}; no agent sha256, the server's hash the "
        f"manifest's {median['copy'] / median['server_only']:.2f}"
    )


def _up(url: str) -> bool:
    try:
        return httpx.get(url, timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


if __name__ == "__main__":
    if "--store" in sys.argv and sys.argv[sys.argv.index("--store") + 1 :][:1] == ["s3"]:
        from bench.artifacts_s3 import main as main_s3

        main_s3(sys.argv[1:])
    else:
        main()
