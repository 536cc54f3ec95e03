"""The `tuneplane` command. Each area adds its commands in its own module, listed in COMMAND_MODULES."""

from __future__ import annotations

import importlib
import logging
import os

import click
import psycopg

from app import __version__
from app.errors import Refusal

COMMAND_MODULES = [
    "app.cli.db_cmd",
    "app.cli.up_cmd",
    "app.cli.server_cmd",
    "app.cli.plugins_cmd",
    "app.cli.admin_cmd",
    "app.cli.submit_cmd",
    "app.cli.jobs_launch_cmd",
    "app.cli.telemetry_cmd",
    "app.cli.artifacts_cmd",
    "app.cli.blobs_cmd",
    "app.cli.node_cmd",
    "app.cli.fleet_cmd",
    "app.cli.launch_cmd",
]


class ExpectedError(Exception):
    """An error whose message is the whole story: printed as one line, exit status 1."""


def _known_errors() -> tuple[type[BaseException], ...]:
    from app.client.http import ClientError
    from app.migrate import MigrationError
    from app.settings import SettingsError

    return (ExpectedError, SettingsError, MigrationError, Refusal, ClientError)


log = logging.getLogger("tuneplane.cli")


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text if len(text) <= 300 else text[:300] + "…"


class TunePlaneGroup(click.Group):
    """Turns expected failures into `Error: <one line>` on stderr and a non-zero exit status."""

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except _known_errors() as exc:
            message = getattr(exc, "message", None) or str(exc)
            fields = getattr(exc, "fields", None) or {}
            detail = "; ".join(f"{k}: {v}" for k, v in fields.items() if v != message)
            raise click.ClickException(message + (f" ({detail})" if detail else "")) from exc
        except psycopg.OperationalError as exc:
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise click.ClickException(f"cannot reach the database: {first}") from exc
        except (click.exceptions.ClickException, click.exceptions.Exit, click.exceptions.Abort):
            raise
        except (OSError, ValueError, UnicodeError) as exc:
            # A file, a setting or a value the user gave: one line (the traceback only in the debug log).
            log.debug("command failed", exc_info=True)
            raise click.ClickException(_one_line(exc)) from exc
        except Exception as exc:
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


for _name in COMMAND_MODULES:
    for _command in importlib.import_module(_name).COMMANDS:
        main.add_command(_command)


if __name__ == "__main__":
    main()
