"""Every setting TunePlane uses with a container runtime, in one place (docs/runtimes.md, ADR 0121).

Measured on Debian 12 hosts (podman 4.3.1, runc 1.1, crun 1.8, cgroups v1/hybrid):
- crun 1.8 fails there ("cgroups in hybrid mode not supported"): podman gets `--runtime runc` when runc is
  installed (TUNEPLANE_OCI_RUNTIME names another, or none with an empty value);
- `--ulimit host` and containers.conf `default_ulimits = []` (workers/runner/containers.conf), else
  "setrlimit RLIMIT_NOFILE: Operation not permitted";
- `--init` (catatonit) so that a shell as the container's first process still dies of SIGTERM;
- plain HTTP (`--tls-verify=false`) only for a registry on a loopback address, as for every TunePlane client.
"""

from __future__ import annotations

import os
from pathlib import Path

CONTAINERS_CONF = Path(__file__).with_name("containers.conf")
CATATONIT_PATHS = ("/usr/libexec/podman/catatonit", "/usr/bin/catatonit")
LOOPBACK_HOSTS = ("localhost", "127.0.0.1", "[::1]")


def runtime_name(binary: str) -> str:
    return Path(binary).name


def runtime_env(base: dict[str, str] | None = None) -> dict[str, str]:
    """The process environment for podman/skopeo calls: TunePlane's containers.conf unless the operator
    set CONTAINERS_CONF themselves."""
    env = dict(os.environ if base is None else base)
    env.setdefault("CONTAINERS_CONF", str(CONTAINERS_CONF))
    return env


def oci_runtime() -> str | None:
    wanted = os.environ.get("TUNEPLANE_OCI_RUNTIME")
    if wanted is not None:
        return wanted or None
    import shutil  # only for image jobs: shutil (bz2, lzma) is 2 ms of every runner's start

    return "runc" if shutil.which("runc") else None


def global_options(binary: str) -> list[str]:
    """Options before the podman subcommand (`podman --runtime runc run …`)."""
    if runtime_name(binary) != "podman":
        return []
    oci = oci_runtime()
    return ["--runtime", oci] if oci else []


def run_options(binary: str) -> list[str]:
    """Options of `run` for every member container."""
    options = ["--ulimit", "host"] if runtime_name(binary) == "podman" else []
    init = next((p for p in CATATONIT_PATHS if os.access(p, os.X_OK)), None)
    if init is not None and runtime_name(binary) == "podman":
        options += ["--init", f"--init-path={init}"]
    elif runtime_name(binary) == "docker":
        options.append("--init")
    return options


def registry_of(image: str) -> str:
    first = image.split("/", 1)[0]
    return first if ("." in first or ":" in first or first == "localhost") and "/" in image else "docker.io"


def is_loopback_registry(image: str) -> bool:
    host = registry_of(image).rsplit(":", 1)[0] if not registry_of(image).startswith("[") else "[::1]"
    return host in LOOPBACK_HOSTS or host.startswith("127.")


def tls_options(image: str) -> list[str]:
    """podman pull / skopeo: plain HTTP only to a loopback registry."""
    return ["--tls-verify=false"] if is_loopback_registry(image) else []


def container_name(member_id: int | str, member_dir: Path | str) -> str:
    """Unique on the host: member ids are unique per control plane, the member directory per agent."""
    import hashlib  # only for image jobs (OpenSSL's hashes load at import)

    suffix = hashlib.sha256(str(member_dir).encode()).hexdigest()[:8]
    return f"tuneplane-member-{member_id}-{suffix}"


def remove_command(binary: str, name: str) -> list[str]:
    """What the runner runs after the workload ended: nothing of the member's container may be left."""
    if runtime_name(binary) == "podman":
        return [binary, *global_options(binary), "rm", "--force", "--ignore", name]
    return [binary, "rm", "--force", name]
