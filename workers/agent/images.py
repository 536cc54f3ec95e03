"""PREPARE's image step: pull the pinned image by its digest (in a subprocess: the event loop goes on),
check that it is that digest, and that the tag the user named still points there (a tag moved after the
preview is refused: the user confirmed another image). Progress goes out as prepare events."""

from __future__ import annotations

import asyncio
import shutil
import time

from tuneplane.app.submission.images import normalise_image_ref
from tuneplane.workers.runner.containers import global_options, runtime_env, tls_options

PULL_TIMEOUT = 3600.0


class ImagePrepareFailed(Exception):
    """The image cannot be used; the message says why (the member's prepare failure reason)."""


async def _run(argv: list[str], timeout: float = PULL_TIMEOUT) -> tuple[int, str]:
    process = await asyncio.create_subprocess_exec(
        *argv, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT, env=runtime_env()
    )
    try:
        async with asyncio.timeout(timeout):
            output, _ = await process.communicate()
    except BaseException:
        process.kill()
        await process.wait()
        raise
    return process.returncode or 0, output.decode(errors="replace").strip()


def by_digest(image: str) -> str:
    """`registry/repo@sha256:…` of a pinned `registry/repo:tag@sha256:…`."""
    ref = normalise_image_ref(image)
    return f"{ref.registry}/{ref.repository}@{ref.digest}"


async def current_digest(image: str) -> str | None:
    """What the tag points to now (skopeo, where the node has it; None without skopeo)."""
    skopeo = shutil.which("skopeo")
    if skopeo is None:
        return None
    ref = normalise_image_ref(image)
    tagged = f"{ref.registry}/{ref.repository}:{ref.tag}"
    code, out = await _run(
        [skopeo, "inspect", *tls_options(tagged), "--format", "{{.Digest}}", f"docker://{tagged}"],
        timeout=120,
    )
    if code != 0:
        raise ImagePrepareFailed(f"image {tagged} cannot be inspected: {out.splitlines()[-1:] or ['?']}")
    return out.strip()


async def prepare_image(runtime: str, pin: dict, progress) -> None:
    image = str(pin["image"])
    ref = normalise_image_ref(image)
    if ref.digest is None:
        raise ImagePrepareFailed(f"image {image} is not pinned by digest; preview the job again")
    if ref.tag:
        now = await current_digest(image)
        if now is not None and now != ref.digest:
            raise ImagePrepareFailed(
                f"image {ref.registry}/{ref.repository}:{ref.tag} now points to {now}, not to the "
                f"{ref.digest} the preview pinned; preview the job again"
            )
    exact = by_digest(image)
    options = global_options(runtime)
    code, _ = await _run([runtime, *options, "image", "exists", exact], timeout=60)
    if code != 0:
        await progress("pulling", {"message": f"image {exact}: pulling"})
        started = time.monotonic()
        code, out = await _run([runtime, *options, "pull", *tls_options(exact), "--quiet", exact])
        if code != 0:
            raise ImagePrepareFailed(f"cannot pull image {exact}: {(out.splitlines() or [''])[-1][:300]}")
        await progress(
            "pulled",
            {"message": f"image {exact}: pulled in {time.monotonic() - started:.1f} s"},
        )
    else:
        await progress("reused", {"message": f"image {exact}: already on this node"})
    code, out = await _run(
        [runtime, *options, "image", "inspect", "--format", "{{.Digest}}", exact], timeout=60
    )
    if code != 0 or out.strip() != ref.digest:
        raise ImagePrepareFailed(
            f"image {exact} on this node has digest {out.strip() or '?'}, not {ref.digest}"
        )
