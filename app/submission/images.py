"""Container image references, normalised the way Docker resolves them.

`pytorch/pytorch:2.3` → `docker.io/pytorch/pytorch:2.3`; `ubuntu` → `docker.io/library/ubuntu:latest`;
`ghcr.io/org/img@sha256:…` keeps its digest. A preview pins the normalised form, so what the runner
pulls is exactly what the user confirmed.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

DEFAULT_REGISTRY = "docker.io"
_COMPONENT = re.compile(r"^[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*$")
_TAG = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$")
_DIGEST = re.compile(r"^sha256:[0-9a-f]{64}$")
_REGISTRY = re.compile(r"^(?:[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?)(?:\.[A-Za-z0-9-]+)*(?::\d{1,5})?$")


class ImageRefError(ValueError):
    pass


@dataclass(frozen=True)
class ImageRef:
    registry: str
    repository: str
    tag: str | None
    digest: str | None

    @property
    def normalised(self) -> str:
        text = f"{self.registry}/{self.repository}"
        if self.tag:
            text += f":{self.tag}"
        if self.digest:
            text += f"@{self.digest}"
        return text


def normalise_image_ref(raw: str) -> ImageRef:
    ref = raw.strip()
    if not ref or any(c.isspace() for c in ref):
        raise ImageRefError("an image reference has no spaces, e.g. pytorch/pytorch:2.3")
    digest = None
    if "@" in ref:
        ref, digest = ref.split("@", 1)
        if not _DIGEST.match(digest):
            raise ImageRefError("an image digest is sha256: followed by 64 lowercase hex digits")
    name, tag = ref, None
    last = ref.rsplit("/", 1)[-1]
    if ":" in last:
        name, tag = ref.rsplit(":", 1)
        if not _TAG.match(tag):
            raise ImageRefError(f"{tag!r} is not a valid image tag")
    parts = name.split("/")
    first = parts[0]
    if len(parts) > 1 and ("." in first or ":" in first or first == "localhost"):
        registry, path = first, parts[1:]
        if not _REGISTRY.match(registry):
            raise ImageRefError(f"{registry!r} is not a valid registry host")
    else:
        registry, path = DEFAULT_REGISTRY, parts
        if len(path) == 1:
            path = ["library", *path]
    if not path or not all(_COMPONENT.match(p) for p in path):
        raise ImageRefError(
            f"{name!r} is not a valid repository (lowercase letters, digits and . _ - between them)"
        )
    if tag is None and digest is None:
        tag = "latest"
    return ImageRef(registry.lower(), "/".join(path), tag, digest)


RESOLVE_TIMEOUT = 60.0
FIELD = "image.ref"


def resolve_image_digest(ref: ImageRef) -> tuple[ImageRef, str | None]:
    """The reference pinned to the digest its tag points to now, through the registry's API (`skopeo
    inspect`, OCI distribution), and a warning when it could not be asked (no skopeo where the server
    runs). An unknown image or tag, or a registry the server cannot ask, is refused (422, image.ref: the
    user named it); an answer that is not a digest is 503."""
    import shutil
    import subprocess

    from tuneplane.app.errors import Refusal
    from tuneplane.workers.runner.containers import runtime_env, tls_options

    skopeo = shutil.which("skopeo")
    if skopeo is None:
        if ref.digest is None:
            return ref, f"image {ref.normalised} is pinned by tag only: skopeo is not installed on the server"
        return ref, None
    asked = f"{ref.registry}/{ref.repository}" + (f"@{ref.digest}" if ref.digest else f":{ref.tag}")
    try:
        done = subprocess.run(
            [skopeo, "inspect", *tls_options(asked), "--format", "{{.Digest}}", f"docker://{asked}"],
            capture_output=True,
            text=True,
            timeout=RESOLVE_TIMEOUT,
            env=runtime_env(),
            check=False,
        )
    except subprocess.TimeoutExpired:
        raise Refusal(f"image.ref: registry {ref.registry} did not answer in time", 422, FIELD) from None
    reason = (done.stderr.strip().splitlines() or [""])[-1][:400]
    if done.returncode != 0:
        lowered = reason.lower()
        if any(w in lowered for w in ("manifest unknown", "name unknown", "not found", "unauthorized")):
            raise Refusal(f"image.ref: no image {asked} in registry {ref.registry} ({reason})", 422, FIELD)
        raise Refusal(f"image.ref: registry {ref.registry} cannot answer for {asked} ({reason})", 422, FIELD)
    digest = done.stdout.strip()
    if not _DIGEST.match(digest):
        raise Refusal(f"image.ref: registry {ref.registry} answered no sha256 digest for {asked}", 503, FIELD)
    return ImageRef(ref.registry, ref.repository, ref.tag, digest), None
