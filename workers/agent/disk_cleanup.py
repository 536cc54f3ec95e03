"""What the agent removes from the node's disk, and how much its caches hold.

Run in a thread a little after a prepare (`schedule_clean_caches`: CLEAN_AFTER_PREPARE), then reported as
`node_caches` (the Fleet page shows it; every new control session hears it too):

- the environment cache (`<work-dir>/environments/<digest>/`, workers.agent.environments) and the capsule
  cache (`<work-dir>/capsules/<digest>.tar`): least recently used first, until each fits its limit
  (`TUNEPLANE_ENV_CACHE_MAX_BYTES`, `TUNEPLANE_CAPSULE_CACHE_MAX_BYTES`, docs/runtimes.md); an
  environment a live member uses, or anything used in the last ten minutes, stays;
- capsule downloads nobody finishes any more (`*.partial`, an agent killed mid-fetch), and environment
  builds or removals nobody finishes any more (an agent killed mid-build: `remove_abandoned_builds`;
  counted in the environment cache's bytes until then);
- member directories (`<work-dir>/members/<id>/`: capsule, source, inputs, outputs, logs). Without this a
  long-lived node's disk only grows. A directory is removed once the agent is done with its member — the
  member ended, its end was reported and acknowledged, its outputs and logs were delivered (or given up),
  or the agent already forgot it — and nothing under it changed for `TUNEPLANE_MEMBER_DIR_KEEP` seconds
  (default one day: its logs and outputs stay at hand for someone looking at the node). A directory whose
  member still has a live process (found by the member's tag) is never removed, whatever the records say.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import itertools
import json
import logging
import os
import re
import shutil
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

from tuneplane.workers.agent.environments import environments_dir
from tuneplane.workers.agent.handlers import SESSION_HOOKS, AgentContext
from tuneplane.workers.agent.member_records import MemberRecord, member_tag_in, settled
from tuneplane.workers.disk_usage import tree_usage
from tuneplane.workers.proctree import alive, tagged
from tuneplane.workers.runner.environment_check import READY_MARKER

log = logging.getLogger("tuneplane.agent.disk_cleanup")
_counter = itertools.count()

LIVE_STATES = ("preparing", "prepared", "running")
# Operator settings (docs/runtimes.md), read from the agent's environment.
ENV_CACHE_MAX_BYTES = int(os.environ.get("TUNEPLANE_ENV_CACHE_MAX_BYTES", str(50 * 1024**3)))
CAPSULE_CACHE_MAX_BYTES = int(os.environ.get("TUNEPLANE_CAPSULE_CACHE_MAX_BYTES", str(10 * 1024**3)))
# A capsule fetched this recently may be about to be unpacked by a member still preparing; an environment
# used this recently may belong to a member that began preparing after the clean-up listed live members.
CAPSULE_MIN_AGE = 600.0
ENV_MIN_AGE = 600.0


# ---- the caches ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CacheEntry:
    path: Path
    key: str
    size: int
    used_at: float


def environment_entries(work_dir: Path) -> list[CacheEntry]:
    entries = []
    root = environments_dir(work_dir)
    if not root.is_dir():
        return []
    for path in root.iterdir():
        if path.is_dir() and re.fullmatch(r"[0-9a-f]{64}", path.name) and (path / READY_MARKER).is_file():
            used = (path / READY_MARKER).stat().st_mtime
            entries.append(CacheEntry(path, path.name, tree_usage(path).bytes, used))
    return entries


# A capsule download's partial file unchanged this long belongs to no live fetch (remove_stale_partials).
PARTIAL_STALE_AFTER = 600.0


def capsule_entries(work_dir: Path) -> list[CacheEntry]:
    root = work_dir / "capsules"
    if not root.is_dir():
        return []
    entries = []
    for path in root.glob("*.tar"):
        with contextlib.suppress(OSError):
            stat = path.stat()
            entries.append(
                CacheEntry(path, path.stem, stat.st_size, stat.st_atime if False else stat.st_mtime)
            )
    return entries


def clean_up(
    entries: list[CacheEntry], in_use: set[str], max_bytes: int, min_age: float = 0.0
) -> list[CacheEntry]:
    """Remove the least recently used entries not in use (and not used in the last min_age seconds) until
    the rest fit max_bytes; returns what was removed."""
    total = sum(e.size for e in entries)
    removed = []
    now = time.time()
    for entry in sorted(entries, key=lambda e: e.used_at):
        if total <= max_bytes:
            break
        if entry.key in in_use or now - entry.used_at < min_age:
            continue
        if entry.path.is_dir():
            # Under the digest's build lock (a build or a reuse of it waits), renamed first: a reader
            # never sees a half-deleted environment with its ready marker still there.
            fd = os.open(entry.path.parent / f"{entry.key}.lock", os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                doomed = entry.path.with_name(entry.path.name + f".delete-{os.getpid()}-{next(_counter)}")
                os.rename(entry.path, doomed)
            except OSError:
                continue
            finally:
                os.close(fd)
            shutil.rmtree(doomed, ignore_errors=True)
        else:
            with contextlib.suppress(OSError):
                entry.path.unlink()
        total -= entry.size
        removed.append(entry)
    return removed


def cache_sizes(work_dir: Path) -> dict:
    """What each cache holds. The environments' bytes include builds and removals not finished (running
    now, or abandoned until the next clean-up removes them): the disk they take is the cache's."""
    envs = environment_entries(work_dir)
    capsules = capsule_entries(work_dir)
    unfinished = [tree_usage(path).bytes for path in environment_leftovers(work_dir)]
    return {
        "environments": {
            "count": len(envs),
            "bytes": sum(e.size for e in envs) + sum(unfinished),
            "unfinished": len(unfinished),
        },
        "capsules": {"count": len(capsules), "bytes": sum(e.size for e in capsules)},
    }


# `<digest>.build-<pid>-<n>`: a build (workers.agent.environments); `<digest>.delete-<pid>-<n>`: a removal.
_LEFTOVER = re.compile(r"([0-9a-f]{64})\.(build|delete)-([0-9]+)-[0-9]+")


def environment_leftovers(work_dir: Path) -> list[Path]:
    """Environment directories that are not (yet, or any more) an environment: builds and removals."""
    root = environments_dir(work_dir)
    if not root.is_dir():
        return []
    return sorted(p for p in root.iterdir() if _LEFTOVER.fullmatch(p.name) and p.is_dir())


def remove_abandoned_builds(work_dir: Path) -> list[str]:
    """Builds and removals an agent killed half-way left behind (240 MB each, for ever, before this).

    A build runs under its digest's lock from its first byte until it is renamed into place or removed,
    so a build directory whose digest's lock is free belongs to no running build, whatever its pid (a pid
    can be reused). A removal runs without the lock once renamed: its directory is abandoned when its
    pid is gone. Returns the names removed."""
    removed = []
    for path in environment_leftovers(work_dir):
        digest, kind, pid = _LEFTOVER.fullmatch(path.name).groups()  # type: ignore[union-attr]
        if kind == "delete":
            if alive(int(pid)):
                continue
            shutil.rmtree(path, ignore_errors=True)
        else:
            try:
                fd = os.open(path.parent / f"{digest}.lock", os.O_RDWR | os.O_CREAT, 0o644)
            except OSError:
                continue
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                shutil.rmtree(path, ignore_errors=True)  # under the lock: no build of it can start
            except OSError:
                continue  # a build of this digest runs now (it may be this one)
            finally:
                os.close(fd)
        if not path.exists():
            removed.append(path.name)
    return removed


def environments_in_use(work_dir: Path, records: list) -> set[str]:
    """Digests of the environments of live members (their capsule's runtime pin): never cleaned up."""
    digests = set()
    for record in records:
        if record.state not in LIVE_STATES:
            continue
        spec_path = work_dir / "members" / str(record.member_id) / "capsule" / "spec.json"
        with contextlib.suppress(OSError, ValueError, AttributeError):
            pin = (json.loads(spec_path.read_text()).get("runtime") or {}).get("environment") or {}
            if pin.get("digest"):
                digests.add(str(pin["digest"]))
    return digests


def clean_caches(work_dir: Path, records: list) -> dict:
    """The LRU clean-up of both caches, stale partial downloads and finished members' directories
    run in a thread after a prepare; returns what it removed."""
    in_use = environments_in_use(work_dir, records)
    envs = clean_up(environment_entries(work_dir), in_use, ENV_CACHE_MAX_BYTES, ENV_MIN_AGE)
    capsules = clean_up(capsule_entries(work_dir), set(), CAPSULE_CACHE_MAX_BYTES, CAPSULE_MIN_AGE)
    partials = remove_stale_partials(work_dir)
    abandoned = remove_abandoned_builds(work_dir)
    members = remove_finished_member_dirs(work_dir, records)
    return {
        "environments": [e.key for e in envs],
        "capsules": [e.key for e in capsules],
        "partials": partials,
        "abandoned_builds": abandoned,
        "member_dirs": members,
    }


def remove_stale_partials(work_dir: Path, stale_after: float = PARTIAL_STALE_AFTER) -> list[str]:
    """Capsule downloads nobody finishes any more (an agent killed mid-fetch): a live fetch appends at
    least every 30 s (its read timeout) or gives up, so a partial file unchanged for `stale_after` seconds
    is an orphan. Returns the names removed."""
    removed = []
    now = time.time()
    for path in (work_dir / "capsules").glob("*.partial"):
        with contextlib.suppress(OSError):
            if now - path.stat().st_mtime > stale_after:
                path.unlink()
                removed.append(path.name)
    return removed


async def clean_and_report(
    work_dir: Path, records: list, send: Callable[[str, dict], Awaitable[object]]
) -> None:
    """Clean up both caches (in a thread) and report their sizes (`node_caches`, shown on the Fleet page)."""
    try:
        await asyncio.to_thread(clean_caches, work_dir, records)
        sizes = await asyncio.to_thread(cache_sizes, work_dir)
        await send("node_caches", sizes)
    except Exception as exc:  # a clean-up or report that fails now is retried after the next prepare
        log.warning("cache clean-up or report failed: %s", exc)


_background: set[asyncio.Task] = set()
# Seconds between a prepare and its clean-up: the directory walks, the LRU eviction and the node_caches
# report wait until a gang's launch has settled instead of competing with its prepares, START and reports
# on the node (issue 23). One clean-up still waiting covers every prepare done before it wakes.
CLEAN_AFTER_PREPARE = 2.0
_waiting: set[Path] = set()


def schedule_clean_caches(
    work_dir: Path,
    records: Callable[[], list],
    send: Callable[[str, dict], Awaitable[object]],
    delay: float = CLEAN_AFTER_PREPARE,
) -> None:
    """Clean up the caches and report their sizes `delay` seconds from now, with the member records of
    then (`records()`), unless a clean-up is already waiting to run."""
    if work_dir in _waiting:
        return
    _waiting.add(work_dir)

    async def later() -> None:
        try:
            await asyncio.sleep(delay)
        finally:
            _waiting.discard(work_dir)
        await clean_and_report(work_dir, list(records()), send)

    task = asyncio.get_running_loop().create_task(later())
    _background.add(task)  # keep a reference until it is done (the loop holds tasks weakly)
    task.add_done_callback(_background.discard)


async def report_caches_on_session(ctx: AgentContext) -> None:
    """Every new control session hears the cache sizes (after an agent restart too)."""
    if ctx.paths is not None and ctx.report is not None:
        sizes = await asyncio.to_thread(cache_sizes, ctx.paths.work_dir)
        with contextlib.suppress(Exception):
            await ctx.report("node_caches", sizes)


SESSION_HOOKS.append(report_caches_on_session)


# ---- member directories -------------------------------------------------------------------------------

MEMBER_DIR_KEEP = float(os.environ.get("TUNEPLANE_MEMBER_DIR_KEEP", str(24 * 3600)))


def remove_finished_member_dirs(
    work_dir: Path, records: list[MemberRecord], keep_for: float = MEMBER_DIR_KEEP
) -> list[int]:
    """Remove the directories of members the agent is done with and that have not changed for `keep_for`
    seconds. Returns the member ids removed."""
    needed = {r.member_id for r in records if not settled(r)}
    horizon = time.time() - keep_for
    removed = []
    root = work_dir / "members"
    for path in sorted(root.iterdir()) if root.is_dir() else []:
        if not path.name.isdigit() or not path.is_dir() or int(path.name) in needed:
            continue
        member_id = int(path.name)
        try:
            if tree_usage(path).newest > horizon:
                continue
        except OSError:
            continue
        if tagged(member_tag_in(work_dir, member_id)):
            continue  # a process of it still runs (a record lost with a disk, say): keep its workspace
        # Renamed first, so a half-removed directory never looks like a member's workspace.
        doomed = path.with_name(f".delete-{path.name}-{os.getpid()}-{next(_counter)}")
        try:
            os.rename(path, doomed)
        except OSError:
            continue
        shutil.rmtree(doomed, ignore_errors=True)
        removed.append(member_id)
    return removed
