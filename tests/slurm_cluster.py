"""A real Slurm cluster for the tests: one slurmctld and N slurmd virtual nodes with fake GPUs on this host.

Debian 12's Slurm 22.05 (`apt-get install slurmctld slurmd slurm-client munge`, done by .ci/run). Everything
lives under one temporary directory: its own munged (own socket and key, run as user munge), slurm.conf,
gres.conf, state, spool, pid and log files. Facts that shape the configuration (docs/slurm.md):
  * every virtual node has NodeAddr=127.0.0.1 and its own Port (one shared port: "Job credential replayed");
  * fake GPUs are gres with File= regular device paths (/dev/null, /dev/zero): file-less GPUs are dropped;
  * SlurmUser=root, ProctrackType=proctrack/linuxproc, TaskPlugin=task/none (no cgroups, no systemd here);
  * SlurmdTimeout is short so that a killed slurmd becomes NODE_FAIL in seconds, not minutes;
  * two partitions over the same nodes, `batch` (PriorityTier=1) and `urgent` (PriorityTier=10), with
    PreemptType=preempt/partition_prio and PreemptMode=CANCEL: a job in `urgent` preempts one in `batch`.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

BINARIES = ("slurmctld", "slurmd", "sbatch", "squeue", "scontrol", "sinfo", "scancel", "srun", "munged")
GPU_FILES = ("/dev/null", "/dev/zero")


def missing_binaries() -> list[str]:
    return [b for b in BINARIES if shutil.which(b) is None]


def require_binaries() -> None:
    """Skip the test when the Slurm binaries are missing outside CI; in CI (.ci/run sets
    TUNEPLANE_REQUIRE_SLURM=1 after installing them) a missing binary fails it."""
    import pytest

    missing = missing_binaries()
    if missing:
        message = (
            f"Slurm binaries missing: {', '.join(missing)} "
            "(apt-get install slurmctld slurmd slurm-client munge)"
        )
        if os.environ.get("TUNEPLANE_REQUIRE_SLURM"):
            pytest.fail(message)
        pytest.skip(message)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class SlurmCluster:
    root: Path
    nodes: list[str]
    gpus_per_node: int = 2
    cpus_per_node: int = 2
    ctld_port: int = 0
    node_ports: dict[str, int] = field(default_factory=dict)
    processes: dict[str, subprocess.Popen] = field(default_factory=dict)

    @property
    def conf(self) -> Path:
        return self.root / "etc" / "slurm.conf"

    @property
    def env(self) -> dict[str, str]:
        return {**os.environ, "SLURM_CONF": str(self.conf)}

    @property
    def shared(self) -> Path:
        """The path every node sees (here: one host), declared as the fleet's shared_path."""
        return self.root / "shared"

    # ---- configuration ------------------------------------------------------------------------------

    def write_config(self) -> None:
        etc = self.root / "etc"
        for sub in ("etc", "state", "spool", "log", "run", "shared", "munge"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)
        self.ctld_port = _free_port()
        self.node_ports = {name: _free_port() for name in self.nodes}
        host = socket.gethostname().split(".")[0]
        lines = [
            "ClusterName=tptest",
            f"SlurmctldHost={host}(127.0.0.1)",
            f"SlurmctldPort={self.ctld_port}",
            "SlurmUser=root",
            "SlurmdUser=root",
            f"AuthInfo=socket={self.root / 'munge' / 'munge.socket'}",
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_Core",
            "GresTypes=gpu",
            "MpiDefault=none",
            "ReturnToService=2",
            f"StateSaveLocation={self.root / 'state'}",
            f"SlurmdSpoolDir={self.root / 'spool'}/%n",
            f"SlurmctldPidFile={self.root / 'run' / 'slurmctld.pid'}",
            f"SlurmdPidFile={self.root / 'run'}/slurmd.%n.pid",
            f"SlurmctldLogFile={self.root / 'log' / 'slurmctld.log'}",
            f"SlurmdLogFile={self.root / 'log'}/slurmd.%n.log",
            "SlurmctldDebug=info",
            "SlurmdDebug=info",
            "JobCompType=jobcomp/filetxt",
            f"JobCompLoc={self.root / 'log' / 'jobcomp.txt'}",
            "JobAcctGatherType=jobacct_gather/none",
            "AccountingStorageType=accounting_storage/none",
            "SchedulerType=sched/backfill",
            "SchedulerParameters=sched_interval=2",
            "SlurmdTimeout=5",
            "SlurmctldTimeout=10",
            "MessageTimeout=5",
            "InactiveLimit=0",
            "KillWait=2",
            "MinJobAge=600",
            "PreemptType=preempt/partition_prio",
            "PreemptMode=CANCEL",
            "HealthCheckInterval=0",
        ]
        for name in self.nodes:
            lines.append(
                f"NodeName={name} NodeAddr=127.0.0.1 NodeHostname={host} Port={self.node_ports[name]} "
                f"CPUs={self.cpus_per_node} RealMemory=4096 Gres=gpu:{self.gpus_per_node} State=UNKNOWN"
            )
        lines.append(
            "PartitionName=batch Nodes=ALL Default=YES MaxTime=60 State=UP PriorityTier=1 OverSubscribe=NO"
        )
        lines.append("PartitionName=urgent Nodes=ALL MaxTime=60 State=UP PriorityTier=10 OverSubscribe=NO")
        self.conf.write_text("\n".join(lines) + "\n")
        gres = [
            f"NodeName={name} Name=gpu File={GPU_FILES[i % len(GPU_FILES)]}"
            for name in self.nodes
            for i in range(self.gpus_per_node)
        ]
        (etc / "gres.conf").write_text("\n".join(gres) + "\n")

    # ---- processes ----------------------------------------------------------------------------------

    def _start_munged(self) -> None:
        munge_dir = self.root / "munge"
        munge = pwd.getpwnam("munge")
        key = munge_dir / "munge.key"
        key.write_bytes(os.urandom(1024))
        for path in (munge_dir, key):
            os.chown(path, munge.pw_uid, munge.pw_gid)
        os.chmod(munge_dir, 0o711)
        os.chmod(key, 0o400)
        # munged refuses a socket directory others may write to; ours is 0711, owned by munge.
        self.processes["munged"] = subprocess.Popen(
            [
                "runuser",
                "-u",
                "munge",
                "--",
                "munged",
                "--foreground",
                "--force",
                f"--socket={munge_dir / 'munge.socket'}",
                f"--key-file={key}",
                f"--pid-file={munge_dir / 'munged.pid'}",
                f"--log-file={munge_dir / 'munged.log'}",
                f"--seed-file={munge_dir / 'munged.seed'}",
            ],
            stdout=subprocess.DEVNULL,
            stderr=open(munge_dir / "munged.stderr", "ab"),  # noqa: SIM115
        )
        _wait(lambda: (munge_dir / "munge.socket").exists(), 10, "munged did not create its socket")

    def start_controller(self) -> None:
        self.processes["slurmctld"] = subprocess.Popen(
            ["slurmctld", "-D", "-i", "-f", str(self.conf)],
            env=self.env,
            stdout=subprocess.DEVNULL,
            stderr=open(self.root / "log" / "slurmctld.stderr", "ab"),  # noqa: SIM115
        )

    def stop_controller(self) -> None:
        self._stop("slurmctld")

    def start_node(self, name: str) -> None:
        (self.root / "spool" / name).mkdir(parents=True, exist_ok=True)
        self.processes[f"slurmd:{name}"] = subprocess.Popen(
            ["slurmd", "-D", "-N", name, "-f", str(self.conf)],
            env=self.env,
            stdout=subprocess.DEVNULL,
            stderr=open(self.root / "log" / f"slurmd.{name}.stderr", "ab"),  # noqa: SIM115
        )

    def kill_node(self, name: str) -> None:
        """kill -9 of one slurmd (its job steps stay orphaned, as on a real machine that lost its daemon)."""
        proc = self.processes.pop(f"slurmd:{name}")
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)

    def start(self, timeout: float = 60.0) -> None:
        self.write_config()
        self._start_munged()
        self.start_controller()
        for name in self.nodes:
            self.start_node(name)
        self.wait_idle(timeout)

    def wait_idle(self, timeout: float = 60.0) -> None:
        def idle() -> bool:
            out = self.run("sinfo", "-h", "-N", "-p", "batch", "-o", "%N %t", check=False)
            states = dict(line.split() for line in out.splitlines() if line.strip())
            return len(states) == len(self.nodes) and all(s == "idle" for s in states.values())

        _wait(idle, timeout, f"Slurm nodes not idle; see {self.root / 'log'}")

    def run(self, *argv: str, check: bool = True) -> str:
        result = subprocess.run(argv, env=self.env, capture_output=True, text=True, timeout=30)
        if check and result.returncode != 0:
            raise RuntimeError(f"{' '.join(argv)}: {result.stderr.strip()}")
        return result.stdout

    def squeue_ids(self) -> list[str]:
        return self.run("squeue", "-h", "-o", "%i", check=False).split()

    def _stop(self, key: str) -> None:
        proc = self.processes.pop(key, None)
        if proc is None or proc.poll() is not None:
            return
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)

    def processes_of(self) -> list[int]:
        """Every live process of this cluster, wherever it was reparented: its daemons, their step daemons
        (slurmstepd, which outlive a slurmd by design) and the jobs' own processes all carry its SLURM_CONF
        in their environment (other test sessions' clusters have their own)."""
        needle = f"SLURM_CONF={self.conf}".encode()
        found = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit() or int(entry.name) == os.getpid():
                continue
            try:
                if needle in (entry / "environ").read_bytes().split(b"\0"):
                    found.append(int(entry.name))
            except OSError:  # gone meanwhile, or a zombie (no environment left)
                continue
        return found

    def stop(self) -> None:
        # Jobs first (their steps are our children's children), then the daemons, munged last, then
        # whatever of the cluster is still alive: step daemons of a killed slurmd, which scancel cannot
        # reach, stayed behind for hours before (issue 24).
        self.run("scancel", "--full", "-u", "root", check=False)
        daemons = [k for k in self.processes if k != "munged"]
        for key in daemons:  # all at once: each may take seconds to shut down
            if self.processes[key].poll() is None:
                self.processes[key].terminate()
        for key in daemons:
            self._stop(key)
        self._stop("munged")
        for pid in self.processes_of():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        _wait(lambda: not self.processes_of(), 10, f"processes of the Slurm cluster in {self.root} survived")


def _wait(predicate, timeout: float, message: str) -> None:
    deadline = time.monotonic() + timeout
    delay = 0.05
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(delay)
        delay = min(delay * 2, 0.5)
    raise TimeoutError(message)


def started_cluster(nodes: int = 2) -> Iterator[SlurmCluster]:
    """Generator behind the session fixture: start, yield, always stop and remove."""
    root = Path(tempfile.mkdtemp(prefix="tp-slurm-"))
    os.chmod(root, 0o755)
    cluster = SlurmCluster(root, [f"tpn{i}" for i in range(1, nodes + 1)])
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()
        shutil.rmtree(root, ignore_errors=True)
