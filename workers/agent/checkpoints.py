"""Checkpoints while a member runs: the agent publishes each completed checkpoint directory as its own
artifact version (workers.artifacts.checkpoint) and keeps the member running.

A workload asks for a checkpoint in one of two ways, both plain files under its output directory (so they
work inside a container and without the SDK):

- a request file `.tuneplane/checkpoints/requests/<id>.json` = {"path": P, "name": N, "step": S}, P
  relative to the output directory, S the training step the checkpoint holds, optional (what
  `tuneplane.sdk.checkpoint(path, name=…, step=…)` writes, atomically);
- a completed-marker: a directory directly under a declared output's path that holds a file named
  `.tuneplane-complete` (written last, after the checkpoint's files) is a checkpoint of that output; the
  marker may hold {"step": S}.

Each is published once, as `<N>.<k>` (k counting that member's checkpoints of N from 1), and its result is
written back to `.tuneplane/checkpoints/results/<id>.json` ({"state", "artifact", "reason"}) for the SDK.
What was published is kept in `<member dir>/checkpoints.json`, so an agent restarted mid-run neither
repeats nor forgets one. `tuneplane artifacts checkpoint JOB` reaches the workload as the file
`.tuneplane/checkpoint-requested` ({"requests": n}), which the SDK reads (`sdk.checkpoint_requested()`).

A path that leaves the member's output directory is refused (the agent would otherwise upload whatever
the workload names). LaunchAgent starts a member's watcher with the member; after the member ended the
watcher scans once more (a marker written just before the exit) and, while the server cannot take a
checkpoint yet, keeps trying for FINAL_RETRY seconds before failing it with the reason.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

from tuneplane.workers.agent.handlers import AgentContext, CommandFailed, command
from tuneplane.workers.agent.member_records import member_dir
from tuneplane.workers.agent.prepare import NodeAccess
from tuneplane.workers.artifacts.upload import retryable_status

log = logging.getLogger("tuneplane.agent.checkpoints")

CONTROL_DIR = ".tuneplane"
MARKER = ".tuneplane-complete"
SCAN_INTERVAL = 0.5
# After the member ended, a checkpoint the server could not take yet is tried again (pauses doubling from
# SCAN_INTERVAL up to FINAL_PAUSE_MAX) for FINAL_RETRY seconds; the last try fails it with the reason.
FINAL_RETRY = 600.0
FINAL_PAUSE_MAX = 30.0
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,40}$")


def control_dir(directory: Path) -> Path:
    return directory / "output" / CONTROL_DIR


def _write_json(path: Path, data: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(data, sort_keys=True))
    os.replace(tmp, path)


def _read_json(path: Path) -> dict | None:
    try:
        value = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return value if isinstance(value, dict) else None


def _inside(root: Path, candidate: Path) -> bool:
    root_real, real = os.path.realpath(root), os.path.realpath(candidate)
    return real == root_real or real.startswith(root_real.rstrip(os.sep) + os.sep)


class Pending(NamedTuple):
    """A checkpoint asked for and not handled yet: `root` None when it is refused (`refused` says why)."""

    key: str
    name: str
    root: Path | None
    refused: str
    step: int | None = None  # the training step it holds, as the workload said it


def _step_of(request: dict) -> tuple[int | None, str]:
    """The optional "step" of a request or marker, or why it is refused."""
    step = request.get("step")
    if step is None:
        return None, ""
    if not isinstance(step, int) or isinstance(step, bool) or not 0 <= step < 2**63:
        return None, f"checkpoint step {step!r} must be a whole number, 0 or more"
    return step, ""


def pending_checkpoints(directory: Path, published: dict) -> list[Pending]:
    """Every request and marker not handled yet, in order."""
    output = directory / "output"
    found: list[Pending] = []
    requests = control_dir(directory) / "checkpoints" / "requests"
    if requests.is_dir():
        for path in sorted(requests.glob("*.json")):
            key = f"request:{path.stem}"
            if key in published:
                continue
            request = _read_json(path)
            if request is None:
                continue  # being written (the SDK renames it into place) or not JSON: look again later
            name, rel = str(request.get("name") or ""), str(request.get("path") or "")
            target = output / rel
            step, bad_step = _step_of(request)
            if not _NAME.match(name):
                found.append(
                    Pending(key, name, None, f"checkpoint name {name!r} must be 1-41 letters, digits, _ or -")
                )
            elif bad_step:
                found.append(Pending(key, name, None, bad_step))
            elif not rel or os.path.isabs(rel) or not _inside(output, target):
                found.append(
                    Pending(key, name, None, f"{rel!r} is not a directory inside the output directory")
                )
            elif not target.is_dir():
                found.append(Pending(key, name, None, f"{rel} is not a directory"))
            else:
                found.append(Pending(key, name, target, "", step))
    try:
        spec = json.loads((directory / "capsule" / "spec.json").read_text())
    except (OSError, ValueError):
        spec = {}
    for out in spec.get("outputs") or []:
        base = output / out["path"]
        if not base.is_dir() or not _inside(output, base):
            continue
        for marker in sorted(base.glob(f"*/{MARKER}"), key=lambda m: (m.stat().st_mtime_ns, str(m))):
            key = f"marker:{out['name']}/{marker.parent.name}"
            if key not in published and _inside(output, marker.parent):
                # An empty marker, or one that is not JSON, is a checkpoint without a step (as before).
                step, _bad = _step_of(_read_json(marker) or {})
                found.append(Pending(key, out["name"], marker.parent, "", step))
    return found


def publish_pending(
    access: NodeAccess, directory: Path, say: Callable[[str], None], *, final: bool = False
) -> int:
    """Publish every pending checkpoint of the member in `directory` (blocking); returns how many. A server
    failure leaves the rest for the next scan, except on the `final` one (the member ended and the watcher
    stops retrying): then the checkpoint is failed with the reason instead of being left unpublished."""
    from tuneplane.workers.artifacts.checkpoint import publish_checkpoint
    from tuneplane.workers.artifacts.deliver import node_http

    if not _left_to_publish(directory):
        return 0
    with node_http(access.server, access.credential(), ca_bundle=access.ca_bundle) as http:
        return publish_each(
            directory,
            say,
            lambda member_id, name, root, step: publish_checkpoint(
                http, member_id, name, root, retry_later=not final, step=step
            ),
            final=final,
        )


# publish(member_id, artifact name, directory, step) → the artifact as the server last reported it ({"id",
# "state", "reason"}); raises UploadError (a retryable status: the next scan tries again) or OSError. step:
# the training step the workload said the checkpoint holds (None: not said).
Publish = Callable[[int, str, Path, int | None], dict]


def publish_each(
    directory: Path, say: Callable[[str], None], publish: Publish, *, final: bool = False
) -> int:
    """Every pending checkpoint of the member in `directory`, each through `publish`, numbered per name and
    remembered in `checkpoints.json` (with its result for the SDK). The node agent publishes over HTTP
    (publish_pending); the Slurm worker registers them where they lie on the shared path."""
    from tuneplane.workers.artifacts.upload import UploadError

    state_path = directory / "checkpoints.json"
    state = _read_json(state_path)
    member = json.loads((directory / "member.json").read_text()) if state is None else None
    if state is None:
        # Numbered on from the job's earlier attempts (PREPARE's checkpoint_numbers), so a name is one
        # artifact of the job: attempt 2 publishes checkpoint.5 after attempt 1's checkpoint.4.
        counts = {str(k): int(v) for k, v in ((member or {}).get("checkpoint_numbers") or {}).items()}
        state = {"published": {}, "counts": counts}
    todo = pending_checkpoints(directory, state["published"])
    if not todo:
        return 0
    member = member or json.loads((directory / "member.json").read_text())
    done = 0
    for key, name, root, refused, step in todo:
        if root is None:
            result = {"state": "failed", "artifact": None, "reason": refused}
        else:
            number = int(state["counts"].get(name, 0)) + 1
            artifact_name = f"{name}.{number}"
            try:
                artifact = publish(int(member["member_id"]), artifact_name, root, step)
            except (UploadError, OSError) as exc:
                status = getattr(exc, "status", None)
                if not final and retryable_status(status):
                    say(f"member {member['member_id']}: {artifact_name} not yet published: {exc}")
                    break  # the server is unreachable or busy: the next scan tries again
                # Refused for good (e.g. a fleet without object delivery), or the last try after the
                # member ended: say so, do not retry.
                artifact = {"id": None, "state": "failed", "reason": str(exc)}
            state["counts"][name] = number
            result = {
                "state": artifact.get("state"),
                "artifact": artifact_name,
                "artifact_id": artifact.get("id"),
                "reason": artifact.get("reason") or "",
                "step": step,
            }
        state["published"][key] = result
        _write_json(state_path, state)
        if key.startswith("request:"):
            results = control_dir(directory) / "checkpoints" / "results"
            _write_json(results / f"{key.split(':', 1)[1]}.json", result)
        say(
            f"member {member['member_id']}: checkpoint {result['artifact'] or name} {result['state']}"
            + (f" ({result['reason']})" if result["state"] != "complete" else "")
        )
        done += 1
    return done


def _left_to_publish(directory: Path) -> bool:
    state = _read_json(directory / "checkpoints.json") or {"published": {}}
    try:
        return bool(pending_checkpoints(directory, state["published"]))
    except OSError:  # a marker removed while it was listed: look again
        return True


class CheckpointWatchers:
    """One watcher task per running member: scans for checkpoint requests and markers and publishes them."""

    def __init__(
        self, paths, access: Callable[[], NodeAccess], say: Callable[[str], None], *,
        final_retry: float = FINAL_RETRY,
    ) -> None:  # fmt: skip
        self.paths = paths
        self.access = access
        self.say = say
        self.final_retry = final_retry
        self.tasks: dict[int, tuple[asyncio.Task, asyncio.Event]] = {}

    def start(self, member_id: int) -> None:
        current = self.tasks.get(member_id)
        if current is not None and not current[0].done():
            return
        ended = asyncio.Event()
        task = asyncio.get_running_loop().create_task(self._watch(member_id, ended), name=f"ckpt-{member_id}")
        self.tasks[member_id] = (task, ended)

    def member_ended(self, member_id: int) -> None:
        """The member ended: its watcher makes one last scan (a marker written just before the exit), then
        stops."""
        current = self.tasks.get(member_id)
        if current is not None:
            current[1].set()

    async def _watch(self, member_id: int, ended: asyncio.Event) -> None:
        directory = member_dir(self.paths, member_id)
        give_up_at: float | None = None
        pause = SCAN_INTERVAL
        while True:
            if ended.is_set() and give_up_at is None:
                give_up_at = time.monotonic() + self.final_retry
            final = give_up_at is not None and time.monotonic() >= give_up_at
            try:
                await asyncio.to_thread(publish_pending, self.access(), directory, self.say, final=final)
            except Exception as exc:  # a bad scan must not end the watcher; the next one tries again
                log.warning("member %s: checkpoint scan failed: %s", member_id, exc)
            if give_up_at is None:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(ended.wait(), SCAN_INTERVAL)
                continue
            # The member ended: stop once nothing is left (a checkpoint the server could not take yet is
            # tried again until final_retry has passed; before, it was left unpublished for ever).
            if final or not await asyncio.to_thread(_left_to_publish, directory):
                self.tasks.pop(member_id, None)
                return
            await asyncio.sleep(min(pause, max(give_up_at - time.monotonic(), 0.0)))
            pause = min(pause * 2, FINAL_PAUSE_MAX)


@command("checkpoint")
async def checkpoint(ctx: AgentContext, payload: dict) -> dict:
    """A user asked a running member for a checkpoint: tell the workload through the file the SDK reads."""
    member_id = int(payload["member_id"])
    assert ctx.paths is not None
    directory = member_dir(ctx.paths, member_id)
    if not (directory / "output").is_dir():
        raise CommandFailed(f"member {member_id} does not run on this node")
    path = control_dir(directory) / "checkpoint-requested"
    current = _read_json(path) or {"requests": 0}
    if payload.get("request_id") is not None and current.get("request_id") == payload.get("request_id"):
        return {"member_id": member_id, "requests": current["requests"], "already": True}  # delivered twice
    current = {"requests": int(current.get("requests", 0)) + 1, "request_id": payload.get("request_id")}
    _write_json(path, current)
    return {"member_id": member_id, "requests": current["requests"]}
