"""The `torchrun` integration: PyTorch distributed across a job's members.

One member runs per node. The runner gives each member RANK (the member's rank), WORLD_SIZE (the number
of members), MASTER_ADDR and MASTER_PORT (rank 0's address), plus TUNEPLANE_GPUS_PER_NODE. This wrapper
turns them into a static torch.distributed.run rendezvous and execs it:

    python -m torch.distributed.run --nnodes=WORLD_SIZE --node-rank=RANK
        --nproc-per-node=N --master-addr=MASTER_ADDR --master-port=MASTER_PORT <target>

N is $TUNEPLANE_NPROC_PER_NODE, else the GPUs per node, else 1 (CPU). torchrun then sets RANK,
LOCAL_RANK and WORLD_SIZE per process for the training script; the member's own rank stays available
as TUNEPLANE_MEMBER_RANK. The entrypoint (from $TUNEPLANE_ENTRYPOINT or after `--`) may be
`train.py --epochs 3`, `python train.py …`, `python -m pkg.train …`, or any other program (run with
torchrun's --no-python).
"""

from __future__ import annotations

import os
import shlex
import sys

PYTHON_NAMES = {"python", "python3", os.path.basename(sys.executable)}


class TorchrunConfigError(SystemExit):
    pass


def _required(env: dict[str, str], name: str) -> str:
    value = env.get(name, "").strip()
    if not value:
        raise TorchrunConfigError(f"torchrun: {name} is not set (the runner provides the rendezvous)")
    return value


def target_args(entrypoint: str) -> list[str]:
    tokens = shlex.split(entrypoint)
    if not tokens:
        raise TorchrunConfigError("torchrun: the entrypoint is empty")
    if os.path.basename(tokens[0]) in PYTHON_NAMES:
        tokens = tokens[1:]
        if not tokens:
            raise TorchrunConfigError("torchrun: the entrypoint names python but no script or -m module")
        if tokens[0] == "-m":
            return ["-m", *tokens[1:]]
        return tokens
    if tokens[0].endswith(".py"):
        return tokens
    return ["--no-python", *tokens]


def build_argv(entrypoint: str, env: dict[str, str], python: str = sys.executable) -> list[str]:
    world = int(_required(env, "WORLD_SIZE"))
    rank = int(_required(env, "RANK"))
    if not 0 <= rank < world:
        raise TorchrunConfigError(f"torchrun: RANK {rank} is outside WORLD_SIZE {world}")
    gpus = int(env.get("TUNEPLANE_GPUS_PER_NODE", "0") or 0)
    nproc = int(env.get("TUNEPLANE_NPROC_PER_NODE", "0") or 0) or gpus or 1
    return [
        python,
        "-m",
        "torch.distributed.run",
        f"--nnodes={world}",
        f"--node-rank={rank}",
        f"--nproc-per-node={nproc}",
        f"--master-addr={_required(env, 'MASTER_ADDR')}",
        f"--master-port={int(_required(env, 'MASTER_PORT'))}",
        *target_args(entrypoint),
    ]


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    env = dict(os.environ)
    if "--" in args and args[args.index("--") + 1 :]:
        entrypoint = shlex.join(args[args.index("--") + 1 :])
    else:
        entrypoint = env.get("TUNEPLANE_ENTRYPOINT", "")
    command = build_argv(entrypoint, env)
    os.environ["TUNEPLANE_MEMBER_RANK"] = env["RANK"]
    sys.stdout.flush()
    os.execv(command[0], command)


if __name__ == "__main__":
    main()
