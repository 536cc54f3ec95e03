"""The `tuneplane` command. Each area adds its commands in its own module, listed in COMMAND_MODULES.

A command's module is imported only when that command runs (COMMANDS_BY_NAME says which module holds
it), so that `tuneplane collector` — which the agent starts for every member — and every other command
start without importing the whole CLI (the database driver, rich, pydantic models of other areas)."""

from __future__ import annotations

import importlib
import logging
import os
import sys

import click

from tuneplane.app import __version__
from tuneplane.app.errors import Refusal

# command name → the modules to import for it (the first one lists it in COMMANDS). A test checks that this
# table and the modules' COMMANDS agree.
COMMANDS_BY_NAME: dict[str, tuple[str, ...]] = {
    "db": ("tuneplane.app.cli.db_cmd",),
    "up": ("tuneplane.app.cli.up_cmd",),
    "embedded-postgres": ("tuneplane.app.cli.up_cmd",),
    "server": ("tuneplane.app.cli.server_cmd",),
    "plugins": ("tuneplane.app.cli.plugins_cmd",),
    "admin": ("tuneplane.app.cli.admin_cmd",),
    "preview": ("tuneplane.app.cli.submit_cmd",),
    "confirm": ("tuneplane.app.cli.submit_cmd",),
    "submit": ("tuneplane.app.cli.submit_cmd",),
    "jobs": ("tuneplane.app.cli.submit_cmd", "tuneplane.app.cli.jobs_launch_cmd"),
    "login": ("tuneplane.app.cli.submit_cmd",),
    "telemetry-gateway": ("tuneplane.app.cli.telemetry_cmd",),
    "collector": ("tuneplane.app.cli.telemetry_cmd",),
    "metrics": ("tuneplane.app.cli.telemetry_cmd",),
    "artifacts": ("tuneplane.app.cli.artifacts_cmd",),
    "blobs": ("tuneplane.app.cli.blobs_cmd",),
    "node": ("tuneplane.app.cli.node_cmd",),
    "node-gateway": ("tuneplane.app.cli.node_cmd",),
    "fleet": ("tuneplane.app.cli.fleet_cmd",),
    "token": ("tuneplane.app.cli.teams_cmd",),
    "teams": ("tuneplane.app.cli.teams_cmd",),
    "worker": ("tuneplane.app.cli.launch_cmd",),
    "runner": ("tuneplane.app.cli.launch_cmd",),
    "usage": ("tuneplane.app.cli.usage_cmd",),
}

COMMAND_MODULES = [
    "tuneplane.app.cli.db_cmd",
    "tuneplane.app.cli.up_cmd",
    "tuneplane.app.cli.server_cmd",
    "tuneplane.app.cli.plugins_cmd",
    "tuneplane.app.cli.admin_cmd",
    "tuneplane.app.cli.submit_cmd",
    "tuneplane.app.cli.jobs_launch_cmd",
    "tuneplane.app.cli.telemetry_cmd",
    "tuneplane.app.cli.artifacts_cmd",
    "tuneplane.app.cli.blobs_cmd",
    "tuneplane.app.cli.node_cmd",
    "tuneplane.app.cli.fleet_cmd",
    "tuneplane.app.cli.teams_cmd",
    "tuneplane.app.cli.launch_cmd",
    "tuneplane.app.cli.usage_cmd",
]


class ExpectedError(Exception):
    """An error whose message is the whole story: printed as one line, exit status 1."""


def _known_errors() -> tuple[type[BaseException], ...]:
    from tuneplane.app.client.transport import ClientError
    from tuneplane.app.migrate import MigrationError
    from tuneplane.app.settings import SettingsError

    return (ExpectedError, SettingsError, MigrationError, Refusal, ClientError)


log = logging.getLogger("tuneplane.cli")


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text if len(text) <= 300 else text[:300] + "…"


def _database_unreachable(exc: BaseException) -> bool:
    # Only a command that imported the driver can fail with its error.
    psycopg = sys.modules.get("psycopg")
    return psycopg is not None and isinstance(exc, psycopg.OperationalError)


def _no_schema(exc: BaseException) -> bool:
    """The database answered but holds no TunePlane schema: a server-side command pointed at the wrong
    installation (the default data directory instead of `tuneplane up --data-dir DIR`'s, a new database)."""
    psycopg = sys.modules.get("psycopg")
    if psycopg is None or not isinstance(exc, psycopg.errors.InvalidSchemaName):
        return False
    return "tuneplane" in str(exc)


NO_SCHEMA = (
    "the database holds no TunePlane schema: point the command at the installation's database with "
    "--data-dir (the one `tuneplane up --data-dir` used; env TUNEPLANE_DATA_DIR) or --database-url "
    "(env TUNEPLANE_DATABASE_URL); `tuneplane db migrate` creates the schema in a new one"
)


def _quiet_stdout() -> None:
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, sys.stdout.fileno())
    finally:
        os.close(devnull)


class TunePlaneGroup(click.Group):
    """Loads each command's module when it runs; turns expected failures into `Error: <one line>` on
    stderr and a non-zero exit status."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMANDS_BY_NAME)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        modules = COMMANDS_BY_NAME.get(cmd_name)
        if modules is None:
            return None
        loaded = [importlib.import_module(name) for name in modules]
        return next(c for c in loaded[0].COMMANDS if c.name == cmd_name)

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except SystemExit:
            # A command's own exit status (the runner's, the collector's): passed through before the
            # next clause imports the modules of the known errors (the database driver among them).
            raise
        except _known_errors() as exc:
            message = getattr(exc, "message", None) or str(exc)
            fields = getattr(exc, "fields", None) or {}
            detail = "; ".join(f"{k}: {v}" for k, v in fields.items() if v != message)
            raise click.ClickException(message + (f" ({detail})" if detail else "")) from exc
        except (click.exceptions.ClickException, click.exceptions.Exit, click.exceptions.Abort):
            raise
        except BrokenPipeError:
            # The reader went away (`tuneplane jobs show 5 | head -1`): what it wanted it has. Every command
            # ends here quietly; stdout points at /dev/null so the interpreter's last flush cannot fail again.
            _quiet_stdout()
            raise click.exceptions.Exit(0) from None
        except (OSError, ValueError, UnicodeError) as exc:
            # A file, a setting or a value the user gave: one line (the traceback only in the debug log).
            log.debug("command failed", exc_info=True)
            raise click.ClickException(_one_line(exc)) from exc
        except Exception as exc:
            if _database_unreachable(exc):
                first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
                raise click.ClickException(f"cannot reach the database: {first}") from exc
            if _no_schema(exc):
                raise click.ClickException(NO_SCHEMA) from exc
            log.debug("command failed", exc_info=True)
            raise click.ClickException(
                f"unexpected {type(exc).__name__}: {_one_line(exc)} (TUNEPLANE_LOG_LEVEL=DEBUG shows where)"
            ) from exc


@click.group(cls=TunePlaneGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="tuneplane")
def main() -> None:
    """TunePlane: a control plane for training and fine-tuning jobs on GPU fleets."""
    logging.basicConfig(
        level=os.environ.get("TUNEPLANE_LOG_LEVEL", "WARNING").upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )


if __name__ == "__main__":
    main()
