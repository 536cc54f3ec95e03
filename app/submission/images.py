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
