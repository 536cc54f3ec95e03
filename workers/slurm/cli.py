"""Slurm through its command-line tools (never slurmrestd, whose schema changes with each release).

Only parsed text output with explicit format strings (`-o "%i|%T|…"`, `scontrol … -o`), which 20.11–23.x
print the same way, so Debian 12's 22.05 (no `squeue --only-job-state`, no `--json` without the openapi
plugin) works. The version is read once at worker start; an unsupported one is refused with the reason.
A command that cannot reach the controller raises ControllerUnreachable: nothing is decided from silence.
"""

from __future__ import annotations

import os
import re
import subprocess
from dataclasses import dataclass

# Oldest release whose text formats this module was checked against.
MIN_VERSION = (20, 11)
UNREACHABLE = (
    "Unable to contact slurm controller",
    "Socket timed out",
    "Connection refused",
    "Communication connection failure",
    "Zero Bytes were transmitted",
    "slurm_load_",
)


class SlurmError(Exception):
    """A Slurm command answered with an error (the controller was reached)."""


class ControllerUnreachable(SlurmError):
    """The controller did not answer."""


class UnsupportedSlurm(SlurmError):
    """The cluster's Slurm is a version this backend does not drive."""


@dataclass(frozen=True)
class SlurmNode:
    name: str
    address: str
    state: str
    reason: str | None
    cpus: int
    memory_mb: int
    gpus: int
    gpu_model: str


@dataclass(frozen=True)
class QueuedJob:
    slurm_job_id: int
    state: str
    reason: str
    node_list: str
    partition: str
    priority: int
    name: str = ""


class SlurmCli:
    def __init__(self, slurm_conf: str | None, timeout: float = 15.0) -> None:
        self.env = dict(os.environ)
        if slurm_conf:
            self.env["SLURM_CONF"] = slurm_conf
        self.timeout = timeout

    def run(self, *argv: str, stdin: str | None = None) -> str:
        try:
            result = subprocess.run(
                argv, env=self.env, input=stdin, capture_output=True, text=True, timeout=self.timeout
            )
        except subprocess.TimeoutExpired as exc:
            raise ControllerUnreachable(f"{argv[0]} did not answer in {self.timeout:.0f}s") from exc
        except FileNotFoundError as exc:
            raise UnsupportedSlurm(f"{argv[0]} is not installed on this worker's machine") from exc
        if result.returncode != 0:
            message = (result.stderr or result.stdout).strip().splitlines()
            text = message[-1] if message else f"exit status {result.returncode}"
            if any(marker in (result.stderr or "") for marker in UNREACHABLE):
                raise ControllerUnreachable(f"{argv[0]}: {text}")
            raise SlurmError(f"{argv[0]}: {text}")
        return result.stdout

    # ---- version ------------------------------------------------------------------------------------

    def version(self) -> str:
        """The Slurm version (`sinfo -V`), refusing one older than MIN_VERSION."""
        out = self.run("sinfo", "-V").strip()
        match = re.search(r"(\d+)\.(\d+)\.(\d+)", out)
        if not match:
            raise UnsupportedSlurm(f"cannot read a Slurm version from `sinfo -V`: {out!r}")
        major, minor = int(match.group(1)), int(match.group(2))
        if (major, minor) < MIN_VERSION:
            raise UnsupportedSlurm(
                f"Slurm {match.group(0)} is older than {MIN_VERSION[0]}.{MIN_VERSION[1]}, the oldest release "
                "whose command output this backend parses"
            )
        return match.group(0)

    # ---- the partition ------------------------------------------------------------------------------

    def partition_limits(self, partition: str) -> dict:
        out = self.run("scontrol", "show", "partition", partition, "-o").strip()
        fields = parse_key_values(out)
        if fields.get("PartitionName") != partition:
            raise SlurmError(f"no partition {partition!r} in this cluster")
        return {
            "max_nodes": parse_limit(fields.get("MaxNodes")),
            "max_time_minutes": parse_minutes(fields.get("MaxTime")),
            "total_nodes": int(fields.get("TotalNodes", "0")),
        }

    def nodes(self, partition: str) -> list[SlurmNode]:
        out = self.run("sinfo", "-h", "-N", "-p", partition, "-o", "%N|%o|%t|%c|%m|%G|%E")
        nodes: dict[str, SlurmNode] = {}
        for line in out.splitlines():
            if not line.strip():
                continue
            name, address, state, cpus, memory, gres, reason = line.split("|", 6)
            gpus, model = parse_gpus(gres)
            nodes[name] = SlurmNode(
                name=name,
                address=address,
                state=state.rstrip("*~#!%$@^-"),
                reason=None if reason in ("none", "") else reason,
                cpus=int(cpus),
                memory_mb=int(memory),
                gpus=gpus,
                gpu_model=model,
            )
        return list(nodes.values())

    # ---- jobs ---------------------------------------------------------------------------------------

    def submit(self, script: str) -> int:
        out = self.run("sbatch", "--parsable", stdin=script).strip()
        return int(out.split(";")[0])

    def queue(self, only: list[int] | None = None) -> dict[int, QueuedJob]:
        """Every job Slurm still lists (all partitions, all users), or only the jobs `only` names (a job
        Slurm no longer knows is simply absent: this read never concludes that a job ended)."""
        argv = ["squeue", "-h", "-a", "-o", "%i|%T|%r|%N|%P|%Q|%j"]
        if only is not None:
            argv += ["-j", ",".join(str(i) for i in only)]
            try:
                out = self.run(*argv)
            except SlurmError as exc:
                if isinstance(exc, ControllerUnreachable):
                    raise
                return {}  # "Invalid job id specified": gone from the controller
        else:
            out = self.run(*argv)
        jobs: dict[int, QueuedJob] = {}
        for line in out.splitlines():
            if not line.strip():
                continue
            job_id, state, reason, node_list, partition, priority, name = line.split("|", 6)
            if not job_id.isdigit():
                continue  # array or het job components: not ours
            jobs[int(job_id)] = QueuedJob(
                int(job_id), state, reason, node_list, partition, int(priority), name
            )
        return jobs

    def hostnames(self, node_list: str) -> list[str]:
        return self.run("scontrol", "show", "hostnames", node_list).split()

    def job_end(self, slurm_job_id: int) -> tuple[str, str]:
        """(end state, detail) of a job that left squeue: scontrol while the controller still remembers it
        (MinJobAge), otherwise ('UNKNOWN', why)."""
        try:
            out = self.run("scontrol", "show", "job", str(slurm_job_id), "-o")
        except SlurmError as exc:
            if isinstance(exc, ControllerUnreachable):
                raise
            return self.completion_record(slurm_job_id)
        fields = parse_key_values(out)
        state = fields.get("JobState", "UNKNOWN")
        detail = f"Slurm job {slurm_job_id} {state}, reason {fields.get('Reason', 'None')}"
        if fields.get("ExitCode"):
            detail += f", exit code {fields['ExitCode']}"
        return state, detail

    def completion_record(self, slurm_job_id: int) -> tuple[str, str]:
        """The end of a job the controller forgot (older than MinJobAge): sacct where accounting exists,
        else the jobcomp/filetxt file (JobCompLoc); ('UNKNOWN', why) when neither has it."""
        try:
            out = self.run("sacct", "-n", "-P", "-X", "-j", str(slurm_job_id), "-o", "State,ExitCode")
            line = next((x for x in out.splitlines() if x.strip()), "")
            if line:
                state, _, code = line.partition("|")
                return state.split()[0], f"Slurm job {slurm_job_id} {state} (sacct), exit code {code}"
        except (SlurmError, FileNotFoundError):
            pass  # no accounting storage here
        config = {
            key.strip(): value.strip()
            for key, sep, value in (
                line.partition("=") for line in self.run("scontrol", "show", "config").splitlines()
            )
            if sep
        }
        if config.get("JobCompType") == "jobcomp/filetxt" and config.get("JobCompLoc"):
            needle = f"JobId={slurm_job_id} "
            try:
                with open(config["JobCompLoc"], encoding="utf-8", errors="replace") as handle:
                    lines = [x for x in handle if x.startswith(needle)]
            except OSError as exc:
                return "UNKNOWN", f"Slurm no longer knows job {slurm_job_id}; jobcomp unreadable ({exc})"
            if lines:
                fields = parse_key_values(lines[-1])
                state = fields.get("JobState", "UNKNOWN")
                return (
                    state,
                    f"Slurm job {slurm_job_id} {state} (jobcomp), exit code {fields.get('ExitCode')}",
                )
        return "UNKNOWN", f"Slurm no longer knows job {slurm_job_id} and keeps no completion record of it"

    def cancel(self, slurm_job_id: int, running: bool) -> None:
        """A running job: SIGTERM to the batch script and every step (`--full`); the caller sends the final
        scancel after the grace. A pending one is cancelled outright (a signal to it is an error)."""
        argv = ["scancel", "--full", "--signal=TERM"] if running else ["scancel"]
        try:
            self.run(*argv, str(slurm_job_id))
        except SlurmError as exc:
            if isinstance(exc, ControllerUnreachable):
                raise
            # Already gone, or it left the running state meanwhile: cancel it outright.
            self.run("scancel", str(slurm_job_id))

    def signal_steps(self, slurm_job_id: int, name: str) -> None:
        """The job's steps (not its batch script, TunePlane's own: neither --batch nor --full) get the signal
        `name` (SIGTERM, SIGUSR1 …): a request to checkpoint and stop (docs/preemption.md)."""
        self.run("scancel", f"--signal={name.removeprefix('SIG')}", str(slurm_job_id))


def parse_key_values(text: str) -> dict[str, str]:
    """`scontrol … -o` output: Key=Value pairs separated by spaces (values have no spaces, except the
    trailing ones we do not read)."""
    fields: dict[str, str] = {}
    for token in text.split():
        key, sep, value = token.partition("=")
        if sep and key not in fields:
            fields[key] = value
    return fields


def parse_limit(value: str | None) -> int | None:
    if value is None or value.upper() in ("UNLIMITED", "INFINITE", "N/A"):
        return None
    return int(value)


def parse_minutes(value: str | None) -> int | None:
    """Slurm time limits: UNLIMITED, minutes, [days-]hours:minutes:seconds or minutes:seconds."""
    if value is None or value.upper() in ("UNLIMITED", "INFINITE", "N/A"):
        return None
    days = 0
    if "-" in value:
        d, value = value.split("-", 1)
        days = int(d)
    parts = [int(p) for p in value.split(":")]
    if len(parts) == 3:
        minutes = parts[0] * 60 + parts[1] + (1 if parts[2] else 0)
    elif len(parts) == 2:
        minutes = parts[0] + (1 if parts[1] else 0)
    else:
        minutes = parts[0]
    return days * 1440 + minutes


def parse_gpus(gres: str) -> tuple[int, str]:
    """GPUs in a node's gres (`gpu:2`, `gpu:a100:4(S:0-1)`, `gpu:2,shard:8`, `(null)`): (count, model)."""
    for item in gres.split(","):
        parts = re.sub(r"\(.*?\)", "", item).split(":")
        if parts[0] != "gpu" or len(parts) < 2:
            continue
        count = parts[-1]
        model = parts[1] if len(parts) == 3 else "gpu"
        if count.isdigit():
            return int(count), model
    return 0, "gpu"
