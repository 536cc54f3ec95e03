"""Job environments on a node: built once per lock digest during PREPARE, shared, cleaned up by LRU
(workers.agent.disk_cleanup).

`<work-dir>/environments/<digest>/` is a virtual environment built with uv from the lock the preview
pinned (app/submission/environments.py). A build runs in `<digest>.build-<pid>-<n>/`, is checked against
the lock, gets its ready marker `.tuneplane-env.json` and is renamed into place atomically, so a reader
sees a whole environment or none. One build per digest at a time: builders hold `<digest>.lock` (flock,
taken by a bounded non-blocking poll so a cancelled prepare never leaves a thread blocked in flock);
whoever comes second finds the ready marker and reuses it. Everything runs in subprocesses or threads:
the agent's event loop (heartbeats, other members) is never held by a build.

`base: node` environments sit on the node's interpreter (`uv venv --python <the agent's interpreter>`)
and see the node's site-packages through a `.pth` file after their own, so the node's torch is used and
the lock's packages take precedence.
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
import sys
import sysconfig
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

from tuneplane.app.uvtool import uv_binary, uv_environment, uv_reason
from tuneplane.workers.runner.environment_check import (
    READY_MARKER,
    EnvironmentMismatch,
    interpreter_of,
    verify_environment,
)

log = logging.getLogger("tuneplane.agent.environments")
LOCK_POLL = 0.2
BUILD_TIMEOUT = 3600.0
NODE_SITE_PTH = "_tuneplane_node_site.pth"
# Tests only (tests/e2e/test_environments.py): hold each build this many seconds after its venv exists.
HOLD_BUILD = float(os.environ.get("TUNEPLANE_TEST_HOLD_ENVIRONMENT_BUILD") or 0)
_counter = itertools.count()

Progress = Callable[[str, dict], Awaitable[None]]


class EnvironmentBuildFailed(Exception):
    """uv could not build the lock here; the message carries uv's reason."""


@dataclass(frozen=True)
class BuiltEnvironment:
    path: Path
    python: Path
    reused: bool
    seconds: float


def environments_dir(work_dir: Path) -> Path:
    return work_dir / "environments"


def node_site_paths() -> list[str]:
    """The agent's own site-packages (purelib and platlib): what `base: node` sees underneath."""
    paths = sysconfig.get_paths()
    return list(dict.fromkeys(str(Path(paths[key]).resolve()) for key in ("purelib", "platlib")))


async def _run_uv(argv: list[str], on_line: Callable[[str], Awaitable[None]] | None = None) -> str:
    """Run uv in a subprocess; its output lines go to on_line as they come; raises with uv's reason."""
    process = await asyncio.create_subprocess_exec(
        *argv, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT, env=uv_environment()
    )
    assert process.stdout is not None
    lines: list[str] = []
    try:
        async with asyncio.timeout(BUILD_TIMEOUT):
            while raw := await process.stdout.readline():
                line = raw.decode(errors="replace").rstrip()
                lines.append(line)
                if on_line is not None and line:
                    await on_line(line)
            code = await process.wait()
    except BaseException:
        with contextlib.suppress(ProcessLookupError):
            process.kill()
        await process.wait()
        raise
    if code != 0:
        raise EnvironmentBuildFailed(uv_reason("\n".join(lines), 1500))
    return "\n".join(lines)


async def _take_lock(path: Path, on_wait: Callable[[], Awaitable[None]]) -> int:
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        waited = False
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return fd
            except BlockingIOError:
                if not waited:
                    waited = True
                    await on_wait()
                await asyncio.sleep(LOCK_POLL)
    except BaseException:
        os.close(fd)
        raise


def _ready(path: Path) -> dict | None:
    try:
        return json.loads((path / READY_MARKER).read_text())
    except (OSError, ValueError):
        return None


def touch(path: Path) -> None:
    """Mark an environment used now (the LRU clean-up keeps recently used ones)."""
    with contextlib.suppress(OSError):
        os.utime(path / READY_MARKER)


async def ensure_environment(work_dir: Path, pin: dict, progress: Progress) -> BuiltEnvironment:
    """The environment of `pin` (the preview's runtime.environment), built here unless it is ready."""
    digest = str(pin["digest"])
    if not re.fullmatch(r"[0-9a-f]{64}", digest):
        raise EnvironmentBuildFailed(f"environment digest {digest!r} is not a sha256")
    root = environments_dir(work_dir)
    root.mkdir(parents=True, exist_ok=True)
    final = root / digest
    started = time.monotonic()
    if _ready(final) is None:

        async def waiting() -> None:
            message = f"environment {digest[:12]}: another prepare is building it; waiting"
            await progress("waiting", {"message": message})

        fd = await _take_lock(root / f"{digest}.lock", waiting)
        try:
            if _ready(final) is None:
                await _build(root, final, pin, progress)
                seconds = time.monotonic() - started
                await progress(
                    "built",
                    {"message": f"environment {digest[:12]} built in {seconds:.1f} s", "seconds": seconds},
                )
                return BuiltEnvironment(final, interpreter_of(final), False, seconds)
        finally:
            os.close(fd)
    marker = _ready(final) or {}
    touch(final)
    await progress(
        "reused",
        {
            "message": f"environment {digest[:12]} reused (built in {marker.get('seconds', 0):.1f} s"
            f" at {marker.get('built_at', '?')})",
            "built_seconds": marker.get("seconds"),
        },
    )
    return BuiltEnvironment(final, interpreter_of(final), True, time.monotonic() - started)


async def _build(root: Path, final: Path, pin: dict, progress: Progress) -> None:
    digest = str(pin["digest"])
    building = root / f"{digest}.build-{os.getpid()}-{next(_counter)}"
    if final.exists():  # a directory without its marker: a build that died before the rename (impossible
        shutil.rmtree(final, ignore_errors=True)  # by construction, but never reuse half an environment)
    base = pin.get("base", "isolated")
    uv = uv_binary()
    started = time.monotonic()
    try:
        python = sys.executable if base == "node" else str(pin.get("python") or "")
        await progress(
            "creating", {"message": f"environment {digest[:12]}: creating ({base}, python {python})"}
        )
        await _run_uv([uv, "venv", "--quiet", "--relocatable", "--python", python, str(building)])
        if HOLD_BUILD > 0:  # tests only: a window to kill the agent in, its build directory half made
            log.warning("environment %s: holding the build for %.0f s (test hook)", digest[:12], HOLD_BUILD)
            await asyncio.sleep(HOLD_BUILD)
        if base == "node":
            site = interpreter_site(building)
            (site / NODE_SITE_PTH).write_text("".join(p + "\n" for p in node_site_paths()))
        lock = building / "tuneplane-lock.txt"
        lock.write_text(str(pin["lock"]))
        count = len(pin.get("packages") or {})
        await progress(
            "installing",
            {
                "message": f"environment {digest[:12]}: downloading and installing {count} packages",
                "total": count,
            },
        )

        downloads = DownloadCounter(digest, count, progress)
        await _run_uv(
            [uv, "pip", "install", "--verbose", "--python", str(interpreter_of(building)), "--require-hashes",
             "--no-deps", "--link-mode", "copy", "-r", str(lock)],
            downloads.line,
        )  # fmt: skip
        await downloads.flush()
        await progress("verifying", {"message": f"environment {digest[:12]}: checking it against the lock"})
        await asyncio.to_thread(verify_environment, building, pin)
        marker = {
            "digest": digest,
            "base": base,
            "python": pin.get("python"),
            "node_site": node_site_paths() if base == "node" else [],
            "seconds": round(time.monotonic() - started, 3),
            "built_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }
        partial = building / (READY_MARKER + ".tmp")
        partial.write_text(json.dumps(marker))
        os.replace(partial, building / READY_MARKER)
        os.rename(building, final)
    except EnvironmentMismatch as exc:
        raise EnvironmentBuildFailed(f"the built environment does not match its lock: {exc}") from exc
    finally:
        if building.exists():
            await asyncio.to_thread(shutil.rmtree, building, True)


# uv --verbose logs each archive it fetches ("Sending fresh GET request for: https://…/six-1.16.0-….whl");
# what its cache already holds is not fetched. Without a terminal it prints no progress bar.
_FETCH = re.compile(r"GET request for: \S+/([^/\s]+\.(?:whl|tar\.gz|zip))\s*$")
_SUMMARY = re.compile(r"^(Prepared|Installed) \d+ package")
PROGRESS_EVERY = 2.0


class DownloadCounter:
    """Turns uv's output into `downloading N of M` progress, at most one event every PROGRESS_EVERY s."""

    def __init__(self, digest: str, total: int, progress: Progress) -> None:
        self.digest, self.total, self.progress = digest, total, progress
        self.fetched: set[str] = set()
        self.reported = 0
        self.last = 0.0

    async def line(self, line: str) -> None:
        match = _FETCH.search(line)
        if match:
            self.fetched.add(match.group(1))
            if time.monotonic() - self.last >= PROGRESS_EVERY:
                await self.flush()
        elif _SUMMARY.match(line):
            await self.flush()
            await self.progress("installing", {"message": f"environment {self.digest[:12]}: {line}"})

    async def flush(self) -> None:
        if len(self.fetched) == self.reported:
            return
        self.reported, self.last = len(self.fetched), time.monotonic()
        await self.progress(
            "downloading",
            {
                "message": f"environment {self.digest[:12]}: downloading {self.reported} of {self.total}"
                " packages (the others from uv's cache)",
                "downloaded": self.reported,
                "total": self.total,
            },
        )


def interpreter_site(env: Path) -> Path:
    found = sorted(env.glob("lib/python3*/site-packages"))
    if not found:
        raise EnvironmentBuildFailed(f"{env} has no lib/python3*/site-packages")
    return found[0]


# ---- what PREPARE calls -------------------------------------------------------------------------------


def progress_reporter(send: Callable[[str, dict], Awaitable[object]], member_id: int) -> Progress:
    """Progress as `member_prepare_progress` reports (job events). Best effort: the durable outcome is
    member_prepared / member_prepare_failed; a progress line lost with the connection is not resent."""
    token = f"{os.getpid()}-{time.time_ns()}"
    numbers = itertools.count(1)

    async def report(step: str, detail: dict) -> None:
        payload = {"member_id": member_id, "seq": f"{token}-{next(numbers)}", "step": step, **detail}
        try:
            await send("member_prepare_progress", payload)
        except Exception:
            pass

    return report


async def prepare_environment(work_dir: Path, spec: dict, progress: Progress | None) -> dict | None:
    """PREPARE's environment step: the member's environment, built or reused; None without one."""
    pin = (spec.get("runtime") or {}).get("environment")
    if not pin:
        return None

    async def quiet(_step: str, _detail: dict) -> None:
        return None

    built = await ensure_environment(work_dir, pin, progress or quiet)
    return {
        "digest": pin["digest"],
        "path": str(built.path),
        "python": str(built.python),
        "reused": built.reused,
        "seconds": round(built.seconds, 3),
    }
