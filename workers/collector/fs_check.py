"""The spool must live on private host-local disk: a network filesystem's fsync and locking promises are
too weak (and it may be shared between hosts), so a spool there is refused at start."""

from __future__ import annotations

import os
from pathlib import Path

NETWORK_FS_TYPES = frozenset(
    {
        "nfs", "nfs4", "cifs", "smb", "smb3", "smbfs", "ncpfs", "afs", "coda", "9p", "ceph", "glusterfs",
        "lustre", "gpfs", "beegfs", "orangefs", "pvfs2", "ocfs2", "gfs2", "davfs", "virtiofs",
        "fuse.sshfs", "fuse.glusterfs", "fuse.s3fs", "fuse.rclone", "fuse.juicefs", "fuse.gcsfuse",
        "fuse.ceph", "fuse.cephfs", "fuse.lizardfs", "fuse.moosefs", "fuse.davfs2", "fuse.goofys",
        "fuse.blobfuse", "fuse.blobfuse2", "fuse.mountpoint-s3", "fuse.weka", "wekafs",
    }
)  # fmt: skip


class NetworkFilesystemError(Exception):
    pass


def _unescape(field: str) -> str:
    # /proc/mounts escapes space, tab, newline and backslash as octal.
    return field.replace("\\040", " ").replace("\\011", "\t").replace("\\012", "\n").replace("\\134", "\\")


def mount_of(path: Path, mounts_text: str) -> tuple[str, str]:
    """(mount point, filesystem type) of the mount that holds `path` (longest matching mount point)."""
    target = str(path)
    best = ("/", "unknown")
    best_len = -1
    for line in mounts_text.splitlines():
        parts = line.split()
        if len(parts) < 3:
            continue
        point, fstype = _unescape(parts[1]), parts[2]
        prefix = point.rstrip("/") + "/"
        if (target == point or target.startswith(prefix) or point == "/") and len(point) >= best_len:
            best, best_len = (point, fstype), len(point)
    return best


def check_local(path: Path, mounts_file: str = "/proc/mounts") -> str:
    """The filesystem type holding `path`; raises NetworkFilesystemError for a network filesystem."""
    resolved = Path(os.path.realpath(path))
    try:
        mounts_text = Path(mounts_file).read_text()
    except OSError:
        return "unknown"  # not Linux: nothing to check against
    point, fstype = mount_of(resolved, mounts_text)
    if fstype in NETWORK_FS_TYPES or fstype.startswith("nfs"):
        raise NetworkFilesystemError(
            f"spool directory {path} is on a network filesystem ({fstype} at {point}); "
            "put the spool on private host-local disk"
        )
    return fstype
