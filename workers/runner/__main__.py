"""`python -m tuneplane.workers.runner --member-dir DIR`: the runner without the CLI (runner_command).
`tuneplane runner --member-dir DIR` runs the same. `--standby`: a runner started before its member, which
reads the member directory and environment from stdin (standby.py)."""

from __future__ import annotations

import sys
from pathlib import Path

USAGE = "usage: python -m tuneplane.workers.runner --member-dir DIR | --standby"


def _member_dir(argv: list[str]) -> Path:
    if len(argv) != 2 or argv[0] != "--member-dir":
        sys.exit(f"{USAGE}\nerror: expected --member-dir DIR, got {' '.join(argv) or 'nothing'}")
    directory = Path(argv[1])
    if not directory.is_dir():
        sys.exit(f"{USAGE}\nerror: --member-dir: {directory} is not a directory")
    return directory


if __name__ == "__main__":
    if sys.argv[1:] == ["--standby"]:
        from tuneplane.workers.runner.standby import serve

        sys.exit(serve())
    directory = _member_dir(sys.argv[1:])
    from tuneplane.workers.runner.process import main

    main(str(directory))
