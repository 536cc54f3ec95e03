"""The `script` integration: runs a source archive's entrypoint (or an image's command) for one member.

The runner starts it in the unpacked source directory with the command in $TUNEPLANE_ENTRYPOINT (or
after `--` on the command line) and the rendezvous variables (RANK, WORLD_SIZE, MASTER_ADDR,
MASTER_PORT) in the environment. The command runs through /bin/sh, so `python train.py --lr 3e-4` and
`make train` both work; the shell replaces this process (exec), so signals reach the user's program and
its exit status is the member's.

    TUNEPLANE_ENTRYPOINT="python train.py" python -m tuneplane.workers.integrations.script
    python -m tuneplane.workers.integrations.script -- python train.py
"""

from __future__ import annotations

import os
import sys


def command_from(argv: list[str], env: dict[str, str]) -> str:
    if "--" in argv:
        rest = argv[argv.index("--") + 1 :]
        if rest:
            import shlex

            return shlex.join(rest)
    command = env.get("TUNEPLANE_ENTRYPOINT", "").strip()
    if not command:
        raise SystemExit("script: no command (set TUNEPLANE_ENTRYPOINT or pass it after --)")
    return command


def main(argv: list[str] | None = None) -> None:
    command = command_from(sys.argv[1:] if argv is None else argv, dict(os.environ))
    sys.stdout.flush()
    os.execvp("/bin/sh", ["/bin/sh", "-c", command])


if __name__ == "__main__":
    main()
