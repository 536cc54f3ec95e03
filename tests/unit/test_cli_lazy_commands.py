"""The CLI imports a command's module only when that command runs: the table that says which module holds
which command must match what the modules hold, and a command must not drag in the rest of the CLI."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys

from tuneplane.app.cli import COMMAND_MODULES, COMMANDS_BY_NAME


def test_the_command_table_lists_exactly_the_commands_the_modules_define() -> None:
    defined = {}
    for name in COMMAND_MODULES:
        for command in importlib.import_module(name).COMMANDS:
            defined[command.name] = name
    assert {k: v[0] for k, v in COMMANDS_BY_NAME.items()} == defined
    assert {m for modules in COMMANDS_BY_NAME.values() for m in modules} == set(COMMAND_MODULES)


def test_the_collector_starts_without_the_database_driver_the_console_or_an_http_library() -> None:
    # What `tuneplane collector` imports before it reads a file (the agent starts one per member); its
    # sender threads import httpx while the first batch is being read.
    code = (
        "import sys; sys.argv = ['tuneplane', 'collector']; import app.cli as c; "
        "cmd = c.main.get_command(None, 'collector'); import workers.collector.collector; "
        "heavy = {'psycopg', 'pydantic', 'flask', 'aiohttp', 'httpx'}; "
        "print(sorted({m.split('.')[0] for m in sys.modules} & heavy))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_jobs_subcommands_from_both_modules_are_there() -> None:
    from tuneplane.app.cli import main

    jobs = main.get_command(None, "jobs")  # type: ignore[arg-type]
    assert {"list", "show", "cancel", "logs"} <= set(jobs.commands)  # type: ignore[attr-defined]


def test_an_unreachable_database_is_one_line_and_no_traceback() -> None:
    # The driver is imported by the command itself now, not by the CLI: its error still reads as one line.
    run = subprocess.run(
        [
            sys.executable,
            "-P",
            "-m",
            "tuneplane",
            "db",
            "status",
            "--database-url",
            "postgresql://tp@127.0.0.1:1/x",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 1
    assert run.stderr.startswith("Error: cannot reach the database: ")
    assert "Traceback" not in run.stderr


def test_a_command_that_exits_with_its_own_status_does_not_import_the_database_driver_on_its_way_out(
    tmp_path,
) -> None:
    # `tuneplane runner` on a directory that was never prepared refuses with its own exit status (SystemExit):
    # the CLI's error handling must not import the modules of the errors it knows (psycopg among them) for it.
    run = subprocess.run(
        [sys.executable, "-P", "-m", "tuneplane", "runner", "--member-dir", str(tmp_path)],
        env={**os.environ, "PYTHONPROFILEIMPORTTIME": "1"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 126, run.stdout + run.stderr[-2000:]
    imported = {
        line.split("|")[-1].strip() for line in run.stderr.splitlines() if line.startswith("import time:")
    }
    assert "tuneplane.workers.runner.process" in imported
    assert not {"psycopg", "pydantic", "tuneplane.app.settings", "tuneplane.app.migrate"} & imported


def test_a_slurm_steps_prepare_imports_no_http_library_and_no_cli(tmp_path) -> None:
    # Issue 23: the step's prepare is on a Slurm launch's critical path (allocation → PREPARED), and httpx
    # (with rich and click) came in through the shared-path resume's module: 0.18 s of its 0.3 s of imports.
    # Here it prepares in an attempt directory without a capsule (it reports prepare_failed and returns 1).
    code = (
        "import sys; from pathlib import Path; from tuneplane.workers.slurm import step; "
        f"code = step.prepare(Path({str(tmp_path)!r}), 0); "
        "heavy = {'psycopg', 'pydantic', 'flask', 'aiohttp', 'httpx', 'rich', 'click'}; "
        "print(code, sorted({m.split('.')[0] for m in sys.modules} & heavy))"
    )
    run = subprocess.run([sys.executable, "-P", "-c", code], capture_output=True, text=True, check=True)
    assert run.stdout.strip() == "1 []"
    assert (tmp_path / "reports" / "0.prepare_failed").is_file()
