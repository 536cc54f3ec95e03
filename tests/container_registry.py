"""A real OCI registry on loopback (Debian's docker-registry) and a tiny image built here (a
busybox-static rootfs, `podman import`, pushed): what the image tests run, with nothing from outside."""

from __future__ import annotations

import io
import shutil
import socket
import subprocess
import tarfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from tuneplane.workers.runner.containers import global_options, runtime_env

TOOLS = ("podman", "skopeo", "docker-registry", "busybox")
APPLETS = ("sh", "echo", "cat", "nc", "sleep", "env", "printf", "test", "seq", "date", "mkdir", "ls", "ps")


def missing_tools() -> list[str]:
    return [tool for tool in TOOLS if shutil.which(tool) is None]


@dataclass
class Registry:
    host: str
    process: subprocess.Popen
    root: Path
    digests: dict[str, str] = field(default_factory=dict)  # tag → digest of what was pushed

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def start_registry(root: Path) -> Registry:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    root.mkdir(parents=True, exist_ok=True)
    config = root / "config.yml"
    config.write_text(
        "version: 0.1\nlog:\n  level: warn\nstorage:\n  filesystem:\n"
        f"    rootdirectory: {root / 'data'}\n  delete:\n    enabled: true\n"
        f"http:\n  addr: 127.0.0.1:{port}\n"
    )
    log = open(root / "registry.log", "wb")  # noqa: SIM115 - the registry's output for the test's life
    process = subprocess.Popen(["docker-registry", "serve", str(config)], stdout=log, stderr=log)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return Registry(f"127.0.0.1:{port}", process, root)
        time.sleep(0.05)
    process.kill()
    raise RuntimeError(f"the registry did not listen: {(root / 'registry.log').read_text()[-500:]}")


def podman(*args: str, stdin: bytes | None = None) -> str:
    binary = shutil.which("podman") or "podman"
    done = subprocess.run(
        [binary, *global_options(binary), *args],
        input=stdin,
        capture_output=True,
        env=runtime_env(),
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"podman {' '.join(args)}: {done.stderr.decode(errors='replace')[-500:]}")
    return done.stdout.decode().strip()


def busybox_rootfs_tar(path: Path, marker: str = "") -> Path:
    """A rootfs of busybox-static with its applets as links; `marker` makes another image (another digest)."""
    tar_path = path.with_suffix(".tar")
    with tarfile.open(tar_path, "w") as tar:
        tar.add(shutil.which("busybox") or "/bin/busybox", arcname="bin/busybox")
        for applet in APPLETS:
            info = tarfile.TarInfo(f"bin/{applet}")
            info.type, info.linkname = tarfile.SYMTYPE, "busybox"
            tar.addfile(info)
        for directory in ("tmp", "etc"):
            info = tarfile.TarInfo(directory)
            info.type, info.mode = tarfile.DIRTYPE, 0o1777
            tar.addfile(info)
        data = f"tuneplane test image {marker}\n".encode()
        info = tarfile.TarInfo("etc/tuneplane-image")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    return tar_path


def push_image(registry: Registry, name: str, tag: str, marker: str = "") -> str:
    """Build the busybox image, push it as registry/name:tag; returns its digest in the registry."""
    ref = f"{registry.host}/{name}:{tag}"
    tar_path = busybox_rootfs_tar(registry.root / f"rootfs-{tag}-{marker or 'x'}", marker)
    podman("import", str(tar_path), ref)
    podman("push", "--tls-verify=false", ref)
    skopeo = shutil.which("skopeo") or "skopeo"
    done = subprocess.run(
        [skopeo, "inspect", "--tls-verify=false", "--format", "{{.Digest}}", f"docker://{ref}"],
        capture_output=True,
        text=True,
        check=True,
        env=runtime_env(),
    )
    podman("rmi", "--force", ref)  # the node pulls it from the registry, as any node would
    return done.stdout.strip()
