"""The node's side of direct S3 delivery (app/artifacts/s3_delivery.py): upload one file's missing parts
in parallel to presigned part URLs, each PUT carrying the part's CRC32C (signed into the URL, so the
store refuses a body that is not the one hashed here). The node holds no store keys; it sees only the URLs
the server signed for its own artifact's staging keys. A resumed upload (an agent restarted mid-file) sends
only the parts the store does not list already (`plan["parts"]`, from ListParts on the server).
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import urllib3

from tuneplane.app.s3store import part_checksum

PARALLEL_PARTS = 4
# A part whose PUT failed for a reason that may pass (connection cut, 5xx) is tried this many times in all.
ATTEMPTS = 3

Presign = Callable[[list[dict[str, Any]]], list[dict[str, Any]]]


class PartRefused(RuntimeError):
    """The store refused a part for good (4xx): a changed file (BadDigest), an expired or foreign URL."""


class StoreUnreachable(RuntimeError):
    """The store did not answer a part's PUT (refused or cut connection, timeout) after every attempt."""


def put_part(pool: urllib3.PoolManager, url: str, data: bytes, headers: dict[str, str]) -> tuple[int, str]:
    """One part's PUT: (status, the start of the answer's body). urllib3, not httpx: measured here, httpx's
    sync client spent 0.15-0.34 CPU-seconds sending one 64 MiB body, urllib3 0.02 (2-3 CPU-s per GiB
    against 0.3) — CPU a node's training may want, and on a small machine the upload's bottleneck."""
    try:
        answer = pool.request("PUT", url, body=data, headers=headers, retries=False, preload_content=True)
    except urllib3.exceptions.HTTPError as exc:
        raise StoreUnreachable(str(exc)) from exc
    return answer.status, answer.data[:300].decode("utf-8", "replace")


def parts_to_send(plan: dict[str, Any]) -> list[tuple[int, int, int]]:
    """(part_number, offset, length) of every part the store does not hold with its full length yet."""
    size, part_size = int(plan["size"]), int(plan["part_size"])
    count = max(1, -(-size // part_size))
    held = {int(p["part_number"]): int(p["size"]) for p in plan.get("parts", [])}
    todo = []
    for number in range(1, count + 1):
        offset = (number - 1) * part_size
        length = min(part_size, size - offset)
        if held.get(number) != length:
            todo.append((number, offset, length))
    return todo


def holds_other_bytes(path: Path, plan: dict[str, Any]) -> bool:
    """Whether a part the store holds for this upload is not these bytes of `path` (its ETag is not their
    MD5): an upload left open by an earlier manifest of the artifact (the agent killed, the output
    rewritten, the artifact registered again). Such an upload is begun afresh: a part sent again under
    its number would leave the store two to choose from (SeaweedFS lists both). S3 makes a part's ETag
    the MD5 of its body (not under SSE-KMS: there nothing matches and every resume starts afresh, which
    is safe). MD5 only here, over the parts held, on a resume."""
    part_size = int(plan["part_size"])
    fd = os.open(path, os.O_RDONLY)
    try:
        for part in plan.get("parts", []):
            offset = (int(part["part_number"]) - 1) * part_size
            data = os.pread(fd, int(part["size"]), offset)
            if str(part.get("etag") or "").strip('"') != hashlib.md5(data, usedforsecurity=False).hexdigest():
                return True
    finally:
        os.close(fd)
    return False


def upload_parts(
    path: Path,
    plan: dict[str, Any],
    presign: Presign,
    *,
    parallel: int = PARALLEL_PARTS,
    timeout: float = 300.0,
) -> int:
    """Send the missing parts of `path`; returns how many were sent. `presign([{part_number, crc32c}])`
    asks the server for the URLs (the server checks the node owns the artifact)."""
    todo = parts_to_send(plan)
    fd = os.open(path, os.O_RDONLY)
    timeouts = urllib3.Timeout(connect=min(30.0, timeout), read=timeout)
    try:
        with urllib3.PoolManager(maxsize=max(1, parallel), timeout=timeouts) as client:

            def send(part: tuple[int, int, int]) -> None:
                number, offset, length = part
                data = os.pread(fd, length, offset)
                if len(data) != length:
                    raise PartRefused(f"{path}: shorter than its manifest (part {number})")
                signed = presign([{"part_number": number, "crc32c": part_checksum(data)}])[0]
                for attempt in range(1, ATTEMPTS + 1):
                    try:
                        status, text = put_part(client, signed["url"], data, signed["headers"])
                    except StoreUnreachable:
                        if attempt == ATTEMPTS:
                            raise
                        continue
                    if status == 200:
                        return
                    if status < 500 or attempt == ATTEMPTS:
                        raise PartRefused(f"{path}: part {number} refused ({status}): {text}")

            with ThreadPoolExecutor(max(1, parallel)) as pool:
                for _ in pool.map(send, todo):
                    pass
    finally:
        os.close(fd)
    return len(todo)
