"""A job's Python environment, resolved at preview to an exact lock with uv.

The JobSpec's `environment` names what the job needs (`packages`, or a `requirements` file inside the
source archive: a requirements.txt, or a pyproject.toml with its uv.lock beside it) and on what it builds
(`base: isolated`, a fresh virtual environment, or `base: node`, the node's interpreter and site-packages
underneath). The server turns it into a lock — every distribution with its version and sha256 hashes —
with `uv pip compile --generate-hashes` (or `uv export` of a uv.lock), and pins the lock and its digest in
the preview. The node builds exactly that lock (workers/agent/environments.py); the runner checks it.

On `base: node` the packages the node provides itself (torch and its companions, which a node has built
for its own CUDA) are removed from the resolution with uv overrides that never match: resolving them
would lock, and the node would download, a CUDA build of several GB.
"""

from __future__ import annotations

import io
import re
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path, PurePosixPath
from typing import Any, BinaryIO

from tuneplane.app.errors import Refusal
from tuneplane.app.submission.canonical import digest_of
from tuneplane.app.submission.jobspec import REQUIREMENT, EnvironmentSpec
from tuneplane.app.uvtool import uv_binary, uv_environment, uv_reason, uv_version
from tuneplane.workers.runner.environment_check import normalise_name

# Provided by a node for `base: node` and never installed by uv (see the module's docstring).
NODE_PROVIDED = ("torch", "torchvision", "torchaudio", "triton")
RESOLVE_TIMEOUT = 180.0
MAX_REQUIREMENTS_BYTES = 256 * 1024


def _which_requirement(reason: str, requested: list[str]) -> int | None:
    lowered = reason.lower()
    for index, item in enumerate(requested):
        name = requirement_name(item)
        variants = {name, name.replace("_", "-"), name.replace("-", "_")}
        if any(re.search(rf"\b{re.escape(v)}\b", lowered) for v in variants):
            return index
    return None


def compile_lock(requirements_text: str, python: str, base: str, field: str, requested: list[str]) -> str:
    """`uv pip compile` of the requirements to a hashed lock; a refusal names the requirement uv names."""
    with tempfile.TemporaryDirectory(prefix="tuneplane-resolve-") as tmp:
        source = Path(tmp) / "requirements.in"
        source.write_text(requirements_text)
        argv = [
            uv_binary(),
            "pip",
            "compile",
            str(source),
            "--generate-hashes",
            "--no-header",
            "--no-annotate",
            "--quiet",
            "--python-version",
            python,
            "--python-platform",
            "linux",
        ]
        if base == "node":
            overrides = Path(tmp) / "node-provided.txt"
            overrides.write_text("".join(f"{name}; sys_platform == 'never'\n" for name in NODE_PROVIDED))
            argv += ["--overrides", str(overrides)]
        try:
            done = subprocess.run(
                argv, capture_output=True, text=True, timeout=RESOLVE_TIMEOUT, env=uv_environment(), cwd=tmp
            )
        except subprocess.TimeoutExpired:
            raise Refusal(
                f"resolving the environment took more than {RESOLVE_TIMEOUT:g} s; try again",
                status=503,
                field=field,
            ) from None
    if done.returncode != 0:
        reason = uv_reason(done.stderr)
        network = any(w in reason for w in ("error sending request", "Failed to fetch", "dns error"))
        if network and "404" not in reason:
            raise Refusal(
                f"the package index cannot be reached to resolve the environment: {reason}",
                status=503,
                field=field,
            )
        index = _which_requirement(reason, requested)
        named = f"{field}.{index}" if index is not None and field.endswith("packages") else field
        what = f" ({requested[index]})" if index is not None else ""
        raise Refusal(f"{named}: the environment cannot be resolved{what}: {reason}", status=422, field=named)
    return done.stdout


def export_uv_lock(pyproject: bytes, uv_lock: bytes, field: str) -> str:
    """A project's uv.lock as a hashed requirements lock (`uv export --frozen`: exactly what it locked)."""
    with tempfile.TemporaryDirectory(prefix="tuneplane-export-") as tmp:
        Path(tmp, "pyproject.toml").write_bytes(pyproject)
        Path(tmp, "uv.lock").write_bytes(uv_lock)
        done = subprocess.run(
            [uv_binary(), "export", "--frozen", "--format", "requirements-txt", "--no-header",
             "--no-annotate", "--no-emit-project", "--quiet"],
            capture_output=True, text=True, timeout=RESOLVE_TIMEOUT, env=uv_environment(), cwd=tmp,
        )  # fmt: skip
    if done.returncode != 0:
        reason = uv_reason(done.stderr)
        raise Refusal(f"{field}: the uv.lock cannot be exported: {reason}", status=422, field=field)
    return done.stdout


_PINNED = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s\\;]+)")


def locked_versions(lock: str) -> dict[str, str]:
    """{normalised name: version} of every `name==version` line of a lock."""
    found = {}
    for line in lock.splitlines():
        match = _PINNED.match(line.strip())
        if match:
            found[normalise_name(match.group(1))] = match.group(2)
    return found


def requirement_name(requirement: str) -> str:
    return normalise_name(re.split(r"[\[<>=!~; ]", requirement, maxsplit=1)[0])


def read_archive_member(archive: BinaryIO, path: str, field: str) -> bytes | None:
    """One regular file of a (validated) source archive, or None when it has no such member."""
    wanted = str(PurePosixPath(path))
    with tarfile.open(fileobj=archive, mode="r:gz") as tar:
        for member in tar:
            name = str(PurePosixPath(member.name.removeprefix("./")))
            if name != wanted:
                continue
            if not member.isfile():
                raise Refusal(f"{field}: {path} in the source archive is not a regular file", 422, field)
            if member.size > MAX_REQUIREMENTS_BYTES:
                raise Refusal(f"{field}: {path} is larger than {MAX_REQUIREMENTS_BYTES} bytes", 422, field)
            handle = tar.extractfile(member)
            return handle.read() if handle is not None else None
    return None


def resolve_environment(
    env: EnvironmentSpec, open_archive: Any | None = None
) -> tuple[dict | None, list[str]]:
    """The `environment` part of the runtime pin (None: the node's interpreter as it is) and warnings.

    `open_archive()` opens the job's source archive (for `requirements`)."""
    if not env.builds:
        return None, []
    python = env.python or f"{sys.version_info.major}.{sys.version_info.minor}"
    base = env.effective_base
    warnings: list[str] = []
    if env.packages:
        requested = list(env.packages)
        node_named = [r for r in requested if requirement_name(r) in NODE_PROVIDED]
        if base == "node" and node_named:
            warnings.append(
                f"{', '.join(node_named)}: provided by the node on base: node (never installed by uv)"
            )
        lock = compile_lock("\n".join(requested) + "\n", python, base, "environment.packages", requested)
        source: dict[str, Any] = {"requested": requested}
    else:
        assert env.requirements is not None
        field = "environment.requirements"
        if open_archive is None:
            raise Refusal(f"{field}: a requirements file needs a source input", status=422, field=field)
        with open_archive() as archive:
            text = read_archive_member(archive, env.requirements, field)
        if text is None:
            raise Refusal(f"{field}: the source archive has no {env.requirements}", status=422, field=field)
        if env.requirements.endswith("pyproject.toml"):
            lock_path = str(PurePosixPath(env.requirements).with_name("uv.lock"))
            with open_archive() as archive:
                uv_lock = read_archive_member(archive, lock_path, field)
            if uv_lock is None:
                raise Refusal(
                    f"{field}: a pyproject.toml needs its uv.lock beside it "
                    f"({lock_path} is not in the archive)",
                    status=422,
                    field=field,
                )
            lock = export_uv_lock(text, uv_lock, field)
        else:
            requirements = text.decode("utf-8", errors="replace")
            lines = (line.strip() for line in io.StringIO(requirements))
            requested = [line for line in lines if line and not line.startswith("#")]
            bad = [r for r in requested if not REQUIREMENT.match(r)]
            if bad:
                raise Refusal(
                    f"{field}: {bad[0]!r} in {env.requirements} is not a plain requirement "
                    "(options, URLs and paths are not accepted)",
                    status=422,
                    field=field,
                )
            lock = compile_lock(requirements, python, base, field, requested)
        source = {"requirements": env.requirements}
    versions = locked_versions(lock)
    pin = {
        "base": base,
        "python": python,
        "lock": lock,
        "packages": versions,
        "uv": uv_version(),
        **source,
    }
    # The digest names the environment on every node: what is installed, on what, for which Python.
    pin["digest"] = digest_of({"base": base, "python": python, "lock": lock})
    return pin, warnings
