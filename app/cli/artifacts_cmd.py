"""`tuneplane artifacts list|download|verify`: client commands over the artifact HTTP endpoints.

NAME is an artifact name, or NAME@RANK when several members of the job produced one by that name.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import click
import httpx

from tuneplane.app import humanize
from tuneplane.app.cli import ExpectedError
from tuneplane.app.cli.fleet_cmd import storage_words
from tuneplane.app.cli.options import api_client, client_options, json_option, print_json, print_table
from tuneplane.app.cli.progress import byte_progress, quiet_option_help
from tuneplane.app.client.bulk_get import bulk_get, proxied
from tuneplane.app.client.http import ApiClient, ClientError
from tuneplane.workers.artifacts.manifest import Manifest, ManifestError
from tuneplane.workers.artifacts.verify import verify_directory

PARTIAL_DIR = ".tuneplane-partial"
DOWNLOAD_BLOCK = 4 * 1024 * 1024
LIST_COLUMNS = [
    "name",
    "attempt",
    "kind",
    "step",
    "state",
    "file_count",
    "size",
    "delivery",
    "digest",
    "verified",
]


def split_name(name: str) -> tuple[str, int | None]:
    if "@" not in name:
        return name, None
    base, _, rank = name.rpartition("@")
    if not rank.isdigit():
        raise ExpectedError(f"{name}: write NAME or NAME@RANK (RANK a member's rank number)")
    return base, int(rank)


def find(client: ApiClient, job: int, name: str, attempt: int | None) -> dict:
    base, rank = split_name(name)
    params = {k: v for k, v in (("rank", rank), ("attempt", attempt)) if v is not None}
    return client.get(f"/jobs/{job}/artifacts/{base}", params=params)


@click.group("artifacts")
def artifacts_group() -> None:
    """Artifacts jobs produced: list them, download them verified, verify what the server stores."""


@artifacts_group.command("list")
@click.argument("job", type=int)
@json_option
@client_options
def list_cmd(job: int, as_json: bool, server: str | None, token: str | None, ca_bundle: str | None) -> None:
    """List the artifacts of JOB (every attempt)."""
    with api_client(server, token, ca_bundle, timeout=300.0) as client:
        rows = client.get(f"/jobs/{job}/artifacts")["artifacts"]
    if as_json:
        print_json(rows)
        return
    for row in rows:
        row["digest"] = row["manifest_digest"][:16]
        row["verified"] = (
            "" if row["last_verify_ok"] is None else ("ok" if row["last_verify_ok"] else "FAILED")
        )
        row["name"] = f"{row['name']}@{row['rank']}"
        row["size"] = humanize.size(row["total_bytes"])  # exact bytes: --json
    print_table(rows, LIST_COLUMNS, empty=f"job {job} has no artifacts yet")


@artifacts_group.command("download")
@click.argument("job", type=int)
@click.argument("name")
@click.argument("dest", type=click.Path(file_okay=False))
@click.option("--attempt", type=int, default=None, help="Attempt number (default: the latest that has NAME).")
@click.option("--quiet", "-q", is_flag=True, help=quiet_option_help)
@client_options
def download_cmd(
    job: int,
    name: str,
    dest: str,
    attempt: int | None,
    quiet: bool,
    server: str | None,
    token: str | None,
    ca_bundle: str | None,
) -> None:
    """Download artifact NAME of JOB into DEST, verifying every file's sha256 while writing it."""
    dest_path = Path(dest)
    with api_client(server, token, ca_bundle, timeout=300.0) as client:
        artifact = find(client, job, name, attempt)
        if artifact["state"] != "complete":
            raise ExpectedError(f"artifact {name} of job {job} is {artifact['state']}: {artifact['reason']}")
        try:
            manifest = Manifest.from_json(artifact["manifest"])
        except ManifestError as exc:
            raise ExpectedError(f"the server sent an unusable manifest: {exc}") from exc
        if manifest.digest != artifact["manifest_digest"]:
            raise ExpectedError(
                "the manifest does not hash to the artifact's manifest digest; not downloading"
            )
        label = f"{name} of job {job}"
        with byte_progress(label, int(artifact.get("total_bytes") or 0), quiet=quiet) as advance:
            total, problems = download_artifact(client, artifact, dest_path, on_bytes=advance)
    if problems:
        raise ExpectedError(f"{len(problems)} file(s) not downloaded: " + "; ".join(problems))
    click.echo(
        f"downloaded {len(artifact['files'])} files ({total} bytes) into {dest_path}; "
        f"every sha256 matches manifest {artifact['manifest_digest']}"
    )


class DownloadMismatch(Exception):
    pass


def download_artifact(
    client: ApiClient,
    artifact: dict,
    dest: Path,
    *,
    parallel: int = 4,
    on_bytes: Callable[[int], None] | None = None,
) -> tuple[int, list[str]]:
    """Download every file of a complete artifact into DEST, `parallel` files at a time, each verified
    while it is written. Returns (bytes written, problems naming each file that failed)."""
    dest.mkdir(parents=True, exist_ok=True)

    def one(entry: dict) -> tuple[int, str | None]:
        try:
            return download_file(client, artifact["id"], entry, dest, on_bytes=on_bytes), None
        except (DownloadMismatch, ClientError) as exc:
            return 0, f"{entry['path']}: {exc}"

    with ThreadPoolExecutor(max_workers=max(1, parallel), thread_name_prefix="download") as pool:
        results = list(pool.map(one, artifact["files"]))
    try:
        (dest / PARTIAL_DIR).rmdir()
    except OSError:
        pass
    return sum(n for n, _ in results), [problem for _, problem in results if problem]


def download_file(
    client: ApiClient,
    artifact_id: int,
    entry: dict,
    dest: Path,
    *,
    on_bytes: Callable[[int], None] | None = None,
) -> int:
    """Stream one file into DEST/.tuneplane-partial, hashing it; fsync it and move it into place only if
    it matches."""
    target = dest / entry["path"]
    # Manifest paths are relative and free of '..'; a symlink already inside DEST must not redirect them.
    if not os.path.realpath(target).startswith(os.path.realpath(dest).rstrip(os.sep) + os.sep):
        raise DownloadMismatch("path leaves the destination directory")
    partial = dest / PARTIAL_DIR / f"{artifact_id}-{entry['file_index']}"
    partial.parent.mkdir(parents=True, exist_ok=True)
    digest = hashlib.sha256()
    size = 0
    try:
        with open(partial, "wb", buffering=0) as handle:
            for block in _file_body(client, artifact_id, entry["file_index"]):
                # Hashed once, while written; each block is the buffer the socket filled (no copy).
                digest.update(block)
                size += len(block)
                _write_all(handle, block)
                if on_bytes is not None:
                    on_bytes(len(block))
            if digest.hexdigest() == entry["sha256"] and size == entry["size"]:
                os.fsync(handle.fileno())
    except Exception as exc:
        partial.unlink(missing_ok=True)
        if isinstance(exc, ClientError):
            raise
        raise DownloadMismatch(f"transfer failed ({exc.__class__.__name__}: {exc})") from exc
    if digest.hexdigest() != entry["sha256"] or size != entry["size"]:
        partial.unlink(missing_ok=True)
        raise DownloadMismatch(f"received {size} bytes with sha256 {digest.hexdigest()[:16]}…, manifest says "
                               f"{entry['size']} bytes with {entry['sha256'][:16]}…")  # fmt: skip
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        os.replace(partial, target)
    except OSError as exc:
        # DEST already holds something else where the file goes (a file where its directory belongs, a
        # directory where the file belongs): named per file, and no verified copy left behind in the
        # partial directory.
        partial.unlink(missing_ok=True)
        raise DownloadMismatch(f"cannot be placed in {dest} ({exc.strerror}: {exc.filename})") from exc
    return size


def _file_body(client: ApiClient, artifact_id: int, file_index: int) -> Iterator[memoryview | bytes]:
    """The stored bytes of one file as the server sends them, unhashed: this client hashes every byte it
    writes (X-Client-Verifies), so the server need not. Read with recv_into a reused 4 MiB buffer
    (app/client/bulk_get.py), or through httpx when the environment names a proxy."""
    path = f"/artifacts/{artifact_id}/files/{file_index}"
    server = client.config.server or ""
    if proxied(server):
        with client.http.stream("GET", path, headers={"X-Client-Verifies": "sha256"}) as response:
            if not response.is_success:
                response.read()
                ApiClient._decode(response)
            yield from response.iter_raw(DOWNLOAD_BLOCK)
        return
    headers = {"X-Client-Verifies": "sha256"}
    # Accept too: a refusal (410 file missing, 503 no store credentials) then comes as JSON whose reason
    # the user is shown, not an HTML page reduced to "server answered HTTP 503".
    headers.update(
        (k, client.http.headers[k])
        for k in ("Authorization", "User-Agent", "Accept")
        if k in client.http.headers
    )
    timeout = client.http.timeout.read or 300.0
    with bulk_get(server, path, headers, ca_bundle=client.config.ca_bundle, timeout=timeout) as response:
        if response.status != 200:
            ApiClient._decode(httpx.Response(response.status, content=response.read_all()))
            raise ClientError(f"server answered HTTP {response.status}", response.status)
        buffer = memoryview(bytearray(DOWNLOAD_BLOCK))
        while n := response.readinto(buffer):
            yield buffer[:n]


def _write_all(handle: Any, block: memoryview | bytes) -> None:
    view = memoryview(block)
    while view:
        view = view[handle.write(view) :]


@artifacts_group.command("verify")
@click.argument("job", type=int)
@click.argument("name")
@click.option("--attempt", type=int, default=None)
@click.option(
    "--dir",
    "local_dir",
    type=click.Path(file_okay=False),
    default=None,
    help="Verify a local copy (e.g. a download) against the manifest instead of the server's stored files.",
)
@json_option
@client_options
def verify_cmd(
    job: int, name: str, attempt: int | None, local_dir: str | None, as_json: bool, server: str | None,
    token: str | None, ca_bundle: str | None,
) -> None:  # fmt: skip
    """Recompute every file of artifact NAME of JOB and compare with its manifest.

    Exits non-zero naming every mismatching, missing (and, for --dir, extra) file.
    """
    with api_client(server, token, ca_bundle, timeout=300.0) as client:
        artifact = find(client, job, name, attempt)
        if local_dir is None:
            report = client.post(f"/artifacts/{artifact['id']}/verify")
        else:
            manifest = Manifest.from_json(artifact["manifest"])
            report = verify_directory(local_dir, manifest).as_json()
    if as_json:
        print_json({"artifact_id": artifact["id"], "manifest_digest": artifact["manifest_digest"], **report})
    if not report["ok"]:
        raise ExpectedError(
            f"artifact {name} of job {job} does not match its manifest: " + "; ".join(report["problems"])
        )
    if not as_json:
        where = local_dir or (
            f"the fleet's store {storage_words(report['storage'])}"
            if report.get("storage")
            else "the server's stored files"
        )
        click.echo(f"ok: {report['checked']} files in {where} match manifest {artifact['manifest_digest']}")


@artifacts_group.command("checkpoint")
@click.argument("job", type=int)
@click.option("--member", "rank", type=int, default=None, help="Only the member of this rank (default: all).")
@json_option
@client_options
def checkpoint_cmd(
    job: int, rank: int | None, as_json: bool, server: str | None, token: str | None, ca_bundle: str | None
) -> None:
    """Ask JOB's running members for a checkpoint now. The workload saves one when it next checks
    (tuneplane.sdk.checkpoint_requested()) and it appears as artifact NAME.N (`artifacts list JOB`)."""
    body = {} if rank is None else {"rank": rank}
    with api_client(server, token, ca_bundle) as client:
        answer = client.post(f"/jobs/{job}/checkpoints", json=body)
    if as_json:
        print_json(answer)
        return
    for asked in answer["asked"]:
        click.echo(f"asked member rank {asked['rank']} (node {asked['node_id']}) for a checkpoint")


COMMANDS = [artifacts_group]
