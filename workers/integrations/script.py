"""The `script` integration: runs a source archive's entrypoint (or an image's command) for one member.

The runner starts it in the unpacked source directory with the command in $TUNEPLANE_ENTRYPOINT (or
after `--` on the command line) and the rendezvous variables (RANK, WORLD_SIZE, MASTER_ADDR,
MASTER_PORT) in the environment. A single simple command (`python train.py --lr 3e-4`: words and quotes,
no shell syntax) replaces this process directly, so the job's signals reach the user's program and its
exit status is the member's: through `/bin/sh -c`, dash (Debian's /bin/sh) would run it as a child, and
a SIGTERM meant for the program would end the shell first (issue 35). Anything else (`cd src && make
train`, `$VAR`, pipes) runs through /bin/sh, which replaces this process; the runner's keeper then waits
for the program a signalled shell leaves behind (workers/runner/process.py).

    TUNEPLANE_ENTRYPOINT="python train.py" python -m tuneplane.workers.integrations.script
    python -m tuneplane.workers.integrations.script -- python train.py
"""

from __future__ import annotations

import os
import re
import shlex
import sys

# Characters of a command that the shell would only split into words and unquote: nothing to expand,
# redirect, chain or substitute (a backslash, `$`, globs, `~`, `;&|<>()` and newlines all send it to sh).
SIMPLE = re.compile(r"[A-Za-z0-9_\-./:,=+@%'\" \t]+")
# Words that are not programs: the shell's keywords and the builtins a command may start with.
SHELL_WORDS = frozenset(
    {"!", "{", "}", "case", "do", "done", "elif", "else", "esac", "exec", "export", "fi", "for", "if", "in",
     "then", "until", "while", ".", ":", "cd", "eval", "set", "ulimit", "umask", "unset", "wait", "trap"}
)  # fmt: skip


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


def direct_argv(command: str) -> list[str] | None:
    """The words of `command` when it is one simple command exec can run as the shell would, else None."""
    if not SIMPLE.fullmatch(command):
        return None
    try:
        words = shlex.split(command)
    except ValueError:  # an unbalanced quote: the shell says so
        return None
    if not words or words[0] in SHELL_WORDS or "=" in words[0]:  # `VAR=x cmd` is an assignment
        return None
    return words


def main(argv: list[str] | None = None) -> None:
    command = command_from(sys.argv[1:] if argv is None else argv, dict(os.environ))
    sys.stdout.flush()
    words = direct_argv(command)
    if words is not None:
        try:
            os.execvp(words[0], words)
        except OSError:
            pass  # not found or not executable: the shell's run of it gives the usual message and status
    os.execvp("/bin/sh", ["/bin/sh", "-c", command])


if __name__ == "__main__":
    main()
