"""The workload's command and environment for one member, from member.json and the capsule.

The environment starts from the runner's own minus every TUNEPLANE_* variable (so no database URL, user
token, enrollment token or node credential can pass through), then adds the job's env and the member's
variables. The only secret a workload gets is its member-scoped telemetry token.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from tuneplane.workers.integrations.script import direct_argv
from tuneplane.workers.runner.containers import (
    container_name,
    global_options,
    remove_command,
    run_options,
    runtime_env,
)

# Set by the runner from what the agent passes it (and nothing else named TUNEPLANE_* passes through).
PASSED_THROUGH = ("TUNEPLANE_TELEMETRY_URL", "TUNEPLANE_TELEMETRY_TOKEN", "TUNEPLANE_MEMBER_TAG")
# Names that must never reach a workload, whatever their prefix.
NEVER = (
    "TUNEPLANE_DATABASE_URL",
    "TUNEPLANE_NODE_CREDENTIAL",
    "TUNEPLANE_ENROLL_TOKEN",
    "TUNEPLANE_TOKEN",
    "PGPASSWORD",
    "PGSERVICEFILE",
    "PGPASSFILE",
)


class MemberPaths:
    """Where a member's files are, under its directory. Plain classes here, not dataclasses: importing
    dataclasses (inspect, ast, dis) was 7 ms of every member's runner start (issue 23)."""

    __slots__ = ("root",)

    def __init__(self, root: Path) -> None:
        self.root = root

    def __eq__(self, other: object) -> bool:
        return isinstance(other, MemberPaths) and other.root == self.root

    def __hash__(self) -> int:
        return hash(self.root)

    def __repr__(self) -> str:
        return f"MemberPaths({self.root!r})"

    @property
    def config(self) -> Path:
        return self.root / "member.json"

    @property
    def capsule(self) -> Path:
        return self.root / "capsule"

    @property
    def src(self) -> Path:
        return self.root / "src"

    @property
    def input(self) -> Path:
        return self.root / "input"

    @property
    def resume(self) -> Path:
        return self.root / "resume"

    @property
    def output(self) -> Path:
        return self.root / "output"

    @property
    def logs(self) -> Path:
        return self.root / "logs"

    @property
    def exit_status(self) -> Path:
        return self.root / "exit_status.json"


class Launch:
    """How the runner starts the workload: argv, working directory, environment, and `cleanup`, run by the
    runner after the workload ended whatever its end (a container's removal)."""

    __slots__ = ("argv", "cleanup", "cwd", "env")

    def __init__(
        self, argv: list[str], cwd: Path, env: dict[str, str], cleanup: list[str] | None = None
    ) -> None:
        self.argv, self.cwd, self.env, self.cleanup = argv, cwd, env, cleanup

    def __repr__(self) -> str:
        return f"Launch(argv={self.argv!r}, cwd={self.cwd!r}, cleanup={self.cleanup!r})"


def member_variables(member: dict, spec: dict, paths: MemberPaths) -> dict[str, str]:
    resources = spec.get("resources") or {}
    values = {
        "RANK": str(member["rank"]),
        "WORLD_SIZE": str(member["world_size"]),
        "LOCAL_RANK": str(member.get("local_rank", 0)),
        "NODE_RANK": str(member.get("node_rank", member["rank"])),
        "MASTER_ADDR": str(member["master_addr"]),
        "MASTER_PORT": str(member["master_port"]),
        "TUNEPLANE_JOB_ID": str(member["job_id"]),
        "TUNEPLANE_ATTEMPT": str(member["attempt"]),
        "TUNEPLANE_MEMBER_RANK": str(member["rank"]),
        "TUNEPLANE_OUTPUT_DIR": str(paths.output),
        "TUNEPLANE_INPUT_DIR": str(paths.input),
        "TUNEPLANE_GPUS_PER_NODE": str(resources.get("gpus_per_node", len(member.get("gpu_indices") or []))),
        "PYTHONUNBUFFERED": "1",
    }
    # The signal a request to checkpoint and stop sends (a preemption, the time limit, an idle reclaim:
    # any job may get one, docs/preemption.md). The SDK traps it for a workload that cooperates
    # (sdk.preempting()); Python's default action for SIGTERM would end it before it saved anything.
    values["TUNEPLANE_PREEMPTION_SIGNAL"] = str((spec.get("preemption") or {}).get("signal") or "SIGTERM")
    if member.get("resume"):
        # The verified checkpoint this attempt resumes from (docs/preemption.md); unset: start fresh.
        values["TUNEPLANE_RESUME_DIR"] = str(paths.resume)
        values["TUNEPLANE_RESUME_FROM"] = str(member["resume"].get("name") or "")
    gpus = member.get("gpu_indices") or []
    if gpus and not member.get("simulated_gpus"):
        values["CUDA_VISIBLE_DEVICES"] = ",".join(str(g) for g in gpus)
        # The indices are NVML's (the agent's inventory and the collector's samples), which follow the PCI
        # bus order; CUDA's default order is fastest-first, which on a machine of mixed boards names other
        # GPUs by the same numbers. PCI_BUS_ID makes CUDA count as NVML does.
        values["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
    input_doc = spec.get("input") or {}
    if input_doc.get("kind") == "recipe":
        values["TUNEPLANE_PARAMS"] = json.dumps(input_doc.get("params") or {}, sort_keys=True)
    elif input_doc.get("kind") == "source":
        values["TUNEPLANE_ENTRYPOINT"] = input_doc.get("entrypoint") or ""
    elif input_doc.get("kind") == "image":
        values["TUNEPLANE_ENTRYPOINT"] = input_doc.get("command") or ""
    return values


def workload_environment(
    member: dict, spec: dict, paths: MemberPaths, inherited: dict[str, str]
) -> dict[str, str]:
    env = {k: v for k, v in inherited.items() if not k.startswith("TUNEPLANE_") and k not in NEVER}
    env.update({k: str(v) for k, v in (spec.get("env") or {}).items() if not k.startswith("TUNEPLANE_")})
    env.update({k: inherited[k] for k in PASSED_THROUGH if inherited.get(k)})
    env.update(member_variables(member, spec, paths))
    return env


def workload_cwd(spec: dict, paths: MemberPaths) -> Path:
    kind = (spec.get("input") or {}).get("kind")
    if kind == "source":
        return paths.src
    work = paths.root / "work"
    work.mkdir(exist_ok=True)
    return work


def activate(env: dict[str, str], venv: Path) -> None:
    """Make `venv` the environment's Python: its bin/ first on PATH, so that `python train.py` in a script
    is that interpreter."""
    env["VIRTUAL_ENV"] = str(venv)
    env["PATH"] = str(venv / "bin") + os.pathsep + env.get("PATH", os.defpath)
    env.pop("PYTHONHOME", None)


def build_launch(
    member: dict,
    spec: dict,
    manifest: dict,
    paths: MemberPaths,
    inherited: dict[str, str],
    container_runtime: str | None,
) -> Launch:
    env = workload_environment(member, spec, paths, inherited)
    cwd = workload_cwd(spec, paths)
    entry = paths.capsule / manifest["integration"]["entry"]
    if container_runtime is None:
        built = member.get("environment") or {}
        if built.get("python"):
            # The job's own environment (workers/agent/environments.py): its interpreter runs the entry.
            activate(env, Path(built["path"]))
            return Launch([built["python"], str(entry)], cwd, env)
        if sys.prefix != sys.base_prefix:
            # The runner's own virtual environment is the runtime check_runtime validated against the pin;
            # without this a script's `python train.py` would be whatever PATH finds first (a system or
            # pyenv interpreter without the pinned packages, nor tuneplane's SDK).
            activate(env, Path(sys.prefix))
        return Launch([sys.executable, str(entry)], cwd, env)
    return container_launch(member, spec, manifest, paths, env, cwd, container_runtime)


def container_launch(
    member: dict, spec: dict, manifest: dict, paths: MemberPaths, env: dict[str, str], cwd: Path, runtime: str
) -> Launch:
    """`<runtime> run` of the pinned image with the member directory at /tuneplane and the member's variables
    (passed by name, so values such as the telemetry token do not show in the command line)."""
    image = (spec.get("runtime") or {}).get("image") or (spec.get("input") or {}).get("image")
    inside = Path("/tuneplane")
    moved = {
        "TUNEPLANE_OUTPUT_DIR": str(inside / "output"),
        "TUNEPLANE_INPUT_DIR": str(inside / "input"),
    }
    if member.get("resume"):
        moved["TUNEPLANE_RESUME_DIR"] = str(inside / "resume")
    container_env = {**member_variables(member, spec, paths), **moved}
    for key in ("TUNEPLANE_TELEMETRY_URL", "TUNEPLANE_TELEMETRY_TOKEN"):
        if env.get(key):
            container_env[key] = env[key]
    container_env.update({k: str(v) for k, v in (spec.get("env") or {}).items()})
    argv = [
        runtime,
        *global_options(runtime),
        "run",
        "--rm",
        "--network=host",
        "--ipc=host",
        f"--name={container_name(member['member_id'], paths.root)}",
        f"--volume={paths.root}:{inside}",
        f"--workdir={inside / cwd.relative_to(paths.root)}",
        *run_options(runtime),
    ]
    for key in sorted(container_env):
        argv.append(f"--env={key}")
    gpus = member.get("gpu_indices") or []
    if gpus and not member.get("simulated_gpus"):
        devices = ",".join(str(g) for g in gpus)
        argv.append(
            f"--gpus=device={devices}" if runtime.endswith("docker") else f"--device=nvidia.com/gpu={devices}"
        )
    argv.append(str(image))
    integration = (spec.get("integration") or {}).get("name")
    if integration == "script":
        # A single simple command runs as the container's process itself, not below a shell that the
        # job's signal would end first (the script integration's rule, workers/integrations/script.py).
        entrypoint = container_env.get("TUNEPLANE_ENTRYPOINT", "")
        argv += direct_argv(entrypoint) or ["/bin/sh", "-c", entrypoint]
    else:
        argv += ["python3", str(inside / "capsule" / manifest["integration"]["entry"])]
    # SIGTERM to `podman run` reaches the container (its signal proxy, then catatonit); after the grace the
    # agent's SIGKILL ends the processes, and the runner removes what podman could not clean up.
    return Launch(
        argv,
        cwd,
        runtime_env({**env, **container_env}),
        remove_command(runtime, container_name(member["member_id"], paths.root)),
    )
