"""`tuneplane preview|confirm|submit|jobs`: client commands over the HTTP forms (no database access).

INPUT is one of --recipe NAME [--param K=V …], --source DIR|FILE.tar.gz --entrypoint CMD, or
--image REF --command CMD; or a whole JobSpec from --spec FILE.yaml|json (flags override its fields).
"""

from __future__ import annotations

import re
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from tuneplane.app import humanize
from tuneplane.app.cli import ExpectedError
from tuneplane.app.cli.options import api_client, client_options, json_option, print_json, print_table
from tuneplane.app.cli.progress import byte_progress, quiet_option_help, reading
from tuneplane.app.client.archive_pack import PackError, pack_directory
from tuneplane.app.client.http import ApiClient
from tuneplane.app.client.spec_file import SpecFileError, load_spec_file
from tuneplane.app.submission.io_flags import parse_input, parse_output


class PriorityType(click.ParamType):
    """--priority: a class name stays a name, a whole number becomes an integer (the JobSpec takes both)."""

    name = "priority"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, int):
            return value
        text = str(value).strip()
        if text.lstrip("+-").isdigit():
            return int(text)
        return text


PRIORITY = PriorityType()

_SHA256 = re.compile(r"^(sha256:)?[0-9a-f]{64}$")


def spec_options(func: Callable) -> Callable:
    options = [
        click.option(
            "--spec",
            "spec_file",
            type=click.Path(dir_okay=False, exists=True),
            help="A JobSpec in YAML or JSON; flags override its fields.",
        ),
        click.option("--recipe", help="Input: a recipe (integration) by name, e.g. demo."),
        click.option(
            "--param", "params", multiple=True, metavar="K=V", help="A recipe parameter (repeatable)."
        ),
        click.option(
            "--source",
            type=click.Path(exists=True),
            help="Input: a source directory (packed, skipping .git, caches, venvs, .tuneplaneignore) "
            "or a .tar.gz.",
        ),
        click.option("--entrypoint", help="The command that runs the source, e.g. 'python train.py'."),
        click.option("--image", help="Input: a container image reference."),
        click.option("--command", "image_command", help="The command to run in the image."),
        click.option(
            "--integration",
            type=click.Choice(["script", "torchrun"]),
            help="How a source or image command runs (default script).",
        ),
        click.option("--nodes", type=int, help="Number of nodes (one member each)."),
        click.option("--gpus-per-node", type=int, help="GPUs per node."),
        click.option("--cpus", type=int, help="CPUs per node."),
        click.option("--memory", help="Memory per node, e.g. 16G."),
        click.option("--fleet", help="Fleet name (default: the one fleet that can satisfy the request)."),
        click.option("--team", help="The team the job belongs to (default: your default team)."),
        click.option(
            "--preemptible/--not-preemptible",
            default=None,
            help="May be preempted (default: its priority class decides: normal and below are); only "
            "preemptible jobs borrow idle GPUs above the team's guarantee.",
        ),
        click.option("--max-attempts", type=int, help="Attempts before the job fails."),
        click.option(
            "--priority",
            type=PRIORITY,
            help="Priority class (scavenger, low, normal, high, urgent) or an integer (higher first).",
        ),
        click.option(
            "--grace",
            "grace_seconds",
            type=click.IntRange(0),
            help="Seconds to checkpoint when asked to stop.",
        ),
        click.option("--env", "env", multiple=True, metavar="K=V", help="Environment variable (repeatable)."),
        click.option(
            "--output",
            "outputs",
            multiple=True,
            metavar="NAME=PATH[:DELIVERY]",
            help="Deliver directory PATH (under the output directory) as artifact NAME; DELIVERY object or "
            "shared (default: the fleet's). Repeatable; replaces the spec's and the recipe's outputs.",
        ),
        click.option(
            "--input",
            "inputs",
            multiple=True,
            metavar="NAME=REF[:PATH]",
            help="Place artifact REF (JOB/NAME, JOB/NAME@RANK or sha256:DIGEST) in the input directory as "
            "NAME (or at PATH). Repeatable; added to the spec's inputs.",
        ),
        click.option(
            "--package",
            "packages",
            multiple=True,
            metavar="REQ",
            help="A package for the job's environment, e.g. 'transformers>=4.40' (repeatable; added to the "
            "spec's). Resolved to a hashed lock at preview (docs/runtimes.md).",
        ),
        click.option(
            "--requirements",
            metavar="PATH",
            help="The environment from a requirements *.txt or a pyproject.toml (with its uv.lock) inside "
            "the source, e.g. requirements.txt.",
        ),
        click.option(
            "--environment-base",
            type=click.Choice(["isolated", "node"]),
            help="isolated: only the lock's packages (default with packages); node: on top of the node's "
            "site-packages (its CUDA torch).",
        ),
        click.option("--python", "python_version", metavar="X.Y", help="The environment's Python version."),
        click.option("--quiet", "-q", is_flag=True, help=quiet_option_help),
    ]
    for option in reversed(options):
        func = option(func)
    return func


def _pairs(values: tuple[str, ...], flag: str) -> dict[str, str]:
    result = {}
    for item in values:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ExpectedError(f"{flag} takes KEY=VALUE, got {item!r}")
        result[key] = value
    return result


def _load_spec_file(path: str) -> dict:
    try:
        return load_spec_file(path)
    except SpecFileError as exc:
        raise ExpectedError(str(exc)) from None


def upload_source(client: ApiClient, source: Path, *, quiet: bool = False, fleet: str | None = None) -> dict:
    """Pack a directory (or take a .tar.gz) and upload it; returns the server's archive facts. `fleet`: the
    fleet the job goes to, so an S3 fleet's archive is kept in its store (docs/artifacts.md)."""
    with tempfile.TemporaryFile() as packed:
        if source.is_dir():
            try:
                result = pack_directory(source, packed)
            except PackError as exc:
                raise ExpectedError(str(exc)) from exc
            click.echo(f"packed {result.files} files ({result.bytes} bytes) from {source}", err=True)
        else:
            if not source.name.endswith((".tar.gz", ".tgz")):
                raise ExpectedError(f"{source}: --source takes a directory or a .tar.gz file")
            packed.write(source.read_bytes())
        size = packed.seek(0, 2)
        packed.seek(0)
        with byte_progress(f"uploading {source.name}", size, quiet=quiet) as advance:
            facts = client.post(
                "/sources",
                params={"fleet": fleet} if fleet else None,
                content=reading(packed, advance),
                headers={"Content-Type": "application/gzip", "Content-Length": str(size)},
            )
    click.echo(f"uploaded source archive {facts['archive']} ({facts['member_count']} members)", err=True)
    return facts


def build_spec(client: ApiClient, opts: dict[str, Any]) -> dict:
    spec: dict[str, Any] = _load_spec_file(opts["spec_file"]) if opts.get("spec_file") else {}
    inputs = [k for k in ("recipe", "source", "image") if opts.get(k)]
    if len(inputs) > 1:
        raise ExpectedError("give one input: --recipe, --source or --image")
    if inputs:
        for key in ("recipe", "source", "image"):
            spec.pop(key, None)
    if opts.get("recipe"):
        spec["recipe"] = {"name": opts["recipe"], "params": _pairs(opts.get("params") or (), "--param")}
    elif opts.get("params"):
        if "recipe" not in spec:
            raise ExpectedError("--param needs --recipe")
        spec["recipe"].setdefault("params", {}).update(_pairs(opts["params"], "--param"))
    fleet = opts.get("fleet") or (spec.get("fleet") if isinstance(spec.get("fleet"), str) else None)
    if opts.get("source"):
        if not opts.get("entrypoint"):
            raise ExpectedError("--source needs --entrypoint (the command that runs it)")
        facts = upload_source(client, Path(opts["source"]), quiet=bool(opts.get("quiet")), fleet=fleet)
        spec["source"] = {"archive": facts["archive"], "entrypoint": opts["entrypoint"]}
    elif isinstance(spec.get("source"), dict):
        archive = str(spec["source"].get("archive", ""))
        if archive and not _SHA256.match(archive) and Path(archive).exists():
            facts = upload_source(client, Path(archive), quiet=bool(opts.get("quiet")), fleet=fleet)
            spec["source"]["archive"] = facts["archive"]
        if opts.get("entrypoint"):
            spec["source"]["entrypoint"] = opts["entrypoint"]
    if opts.get("image"):
        if not opts.get("image_command"):
            raise ExpectedError("--image needs --command")
        spec["image"] = {"ref": opts["image"], "command": opts["image_command"]}
    if opts.get("integration"):
        target = spec.get("source") or spec.get("image")
        if target is None:
            raise ExpectedError("--integration applies to --source or --image")
        target["integration"] = opts["integration"]
    if not any(k in spec for k in ("recipe", "source", "image")):
        raise ExpectedError(
            "give an input: --recipe NAME, --source DIR --entrypoint CMD, --image REF --command "
            "CMD, or --spec FILE"
        )
    resources = dict(spec.get("resources") or {})
    for flag, field in (
        ("nodes", "nodes"),
        ("gpus_per_node", "gpus_per_node"),
        ("cpus", "cpus_per_node"),
        ("memory", "memory_per_node"),
    ):
        if opts.get(flag) is not None:
            resources[field] = opts[flag]
    if resources:
        spec["resources"] = resources
    for field in ("fleet", "team", "preemptible", "max_attempts", "priority"):
        if opts.get(field) is not None:
            spec[field] = opts[field]
    if opts.get("grace_seconds") is not None:
        spec["preemption"] = {**(spec.get("preemption") or {}), "grace_seconds": opts["grace_seconds"]}
    if opts.get("env"):
        spec["env"] = {**(spec.get("env") or {}), **_pairs(opts["env"], "--env")}
    environment = _environment_flags(spec.get("environment"), opts)
    if environment is not None:
        spec["environment"] = environment
    if opts.get("outputs"):
        spec["outputs"] = _parsed(parse_output, opts["outputs"], "--output")
    if opts.get("inputs"):
        spec["inputs"] = [*(spec.get("inputs") or []), *_parsed(parse_input, opts["inputs"], "--input")]
    return spec


def _environment_flags(environment: Any, opts: dict[str, Any]) -> Any:
    """The spec's `environment` with the flags applied (None: no flag and none in the spec). The server
    checks every field (a bad requirement is refused naming environment.packages.N)."""
    flags = {
        "packages": list(opts.get("packages") or ()),
        "requirements": opts.get("requirements"),
        "base": opts.get("environment_base"),
        "python": opts.get("python_version"),
    }
    if not any(flags.values()):
        return environment
    merged = dict(environment) if isinstance(environment, dict) else {}
    if flags["packages"]:
        earlier = merged.get("packages")
        merged["packages"] = [*(earlier if isinstance(earlier, list) else []), *flags["packages"]]
    for field in ("requirements", "base", "python"):
        if flags[field]:
            merged[field] = flags[field]
    return merged


def _parsed(parse: Callable[[str], dict], values: tuple[str, ...], flag: str) -> list[dict]:
    try:
        return [parse(item) for item in values]
    except ValueError as exc:
        raise ExpectedError(f"{flag}: {exc}") from None


SPEC_KEYS = (
    "quiet",
    "outputs",
    "inputs",
    "spec_file",
    "recipe",
    "params",
    "source",
    "entrypoint",
    "image",
    "image_command",
    "integration",
    "nodes",
    "gpus_per_node",
    "cpus",
    "memory",
    "fleet",
    "team",
    "preemptible",
    "max_attempts",
    "priority",
    "grace_seconds",
    "env",
    "packages",
    "requirements",
    "environment_base",
    "python_version",
)


def echo_preview(preview: dict, err: bool = False) -> None:
    s = preview["summary"]
    out = lambda text: click.echo(text, err=err)  # noqa: E731
    out(f"Preview {preview['id']} (expires {humanize.ago(preview['expires_at'])})")
    for label, value in (
        ("input", s["input"]),
        ("team", s["team"]),
        ("fleet", s["fleet"]),
        ("backend", s["backend"]),
        ("GPU request", s["gpu_request"]),
        ("nodes", f"{s['nodes']} (each: {s['per_node']})"),
        ("runtime", s["runtime"]),
        ("integration", s["integration"]),
        ("attempts", s["max_attempts"]),
        ("priority", s["priority"]),
        ("preemption", s.get("preemption", "")),
        ("resume", s.get("resume", "")),
    ):
        out(f"  {label:<12} {value}")
    for pinned in s.get("inputs", []):
        out(f"  {'input':<12} {pinned}")
    for output in s.get("outputs", []):
        out(f"  {'output':<12} {output}")
    for warning in s["warnings"]:
        out(f"  {'warning':<12} {warning}")
    out(f"  {'digest':<12} {preview['digest']}")


def echo_receipt(receipt: dict) -> None:
    again = " (this confirmation was already made: same job)" if receipt.get("replayed") else ""
    click.echo(f"job {receipt['job_id']} {receipt['state']}{again}")
    click.echo(f"  reason     {receipt['state_reason']}")
    click.echo(f"  preview    {receipt['preview_id']}")
    click.echo(f"  digest     {receipt['digest']}")
    click.echo(f"  retry key  {receipt['retry_key']}")
    click.echo(f"  created    {receipt['created_at']}")


@click.command("preview")
@spec_options
@json_option
@client_options
def preview_cmd(as_json: bool, server, token, ca_bundle, **opts: Any) -> None:
    """Resolve a job without creating it: prints the summary, preview id and digest."""
    with api_client(server, token, ca_bundle) as client:
        preview = client.post("/previews", json=build_spec(client, opts))
    if as_json:
        print_json(preview)
        return
    echo_preview(preview)
    click.echo(f"confirm with: tuneplane confirm {preview['id']} --digest {preview['digest']}")


@click.command("confirm")
@click.argument("preview_id")
@click.option("--digest", required=True, help="The digest the preview printed.")
@click.option("--retry-key", default=None, help="Idempotency key (default: derived from the preview id).")
@json_option
@client_options
def confirm_cmd(
    preview_id: str, digest: str, retry_key: str | None, as_json: bool, server, token, ca_bundle
) -> None:
    """Confirm a preview: creates the job (once) and prints its receipt."""
    body = {"digest": digest, "retry_key": retry_key}
    with api_client(server, token, ca_bundle) as client:
        receipt = client.post(f"/previews/{preview_id}/confirm", json=body)
    print_json(receipt) if as_json else echo_receipt(receipt)


@click.command("submit")
@spec_options
@click.option("--yes", "-y", is_flag=True, help="Confirm without asking.")
@click.option(
    "--retry-key",
    default=None,
    help="Idempotency key: the same key and the same resolved job return the same receipt.",
)
@json_option
@client_options
def submit_cmd(
    yes: bool, retry_key: str | None, as_json: bool, server, token, ca_bundle, **opts: Any
) -> None:
    """Preview, show the summary, ask, and confirm."""
    with api_client(server, token, ca_bundle) as client:
        preview = client.post("/previews", json=build_spec(client, opts))
        echo_preview(preview, err=as_json)
        if not yes and not click.confirm("Confirm this job?", default=False, err=True):
            raise ExpectedError("not confirmed; nothing was created")
        body = {"digest": preview["digest"], "retry_key": retry_key}
        receipt = client.post(f"/previews/{preview['id']}/confirm", json=body)
    print_json(receipt) if as_json else echo_receipt(receipt)


@click.group("jobs")
def jobs_group() -> None:
    """Your jobs (an admin sees everyone's)."""


@jobs_group.command("list")
@click.option("--state", default=None, help="Only jobs in this state.")
@click.option("--owner", default=None, help="Only this user's jobs (an admin sees everyone's).")
@click.option("--fleet", default=None, help="Only jobs in this fleet.")
@click.option("--team", default=None, help="Only jobs of this team.")
@click.option("--before", default=None, type=int, help="Only jobs older than this job id (the next page).")
@click.option("--limit", default=100, show_default=True, type=int)
@json_option
@client_options
def jobs_list(
    state: str | None,
    owner: str | None,
    fleet: str | None,
    team: str | None,
    before: int | None,
    limit: int,
    as_json: bool,
    server,
    token,
    ca_bundle,
) -> None:
    """List jobs, newest first (sizes and times for people; --json keeps the exact values)."""
    params: dict[str, Any] = {
        "limit": limit,
        "state": state,
        "owner": owner,
        "fleet": fleet,
        "team": team,
        "before": before,
    }
    with api_client(server, token, ca_bundle) as client:
        answer = client.get("/jobs", params={k: v for k, v in params.items() if v is not None})
    jobs = answer["jobs"]
    if as_json:
        print_json(jobs)
        return
    rows = [
        {
            **j,
            "gpus": j["total_gpus"],
            "memory": humanize.size(j["memory_per_node"]),
            "created": humanize.ago(j["created_at"]),
        }
        for j in jobs
    ]
    columns = ["id", "state", "team", "fleet", "gpus", "memory", "input_summary", "owner", "created"]
    print_table(
        rows,
        [*columns, "state_reason"],
        empty="(no jobs)",
    )
    if answer.get("next_before"):
        click.echo(f"(more: --before {answer['next_before']})", err=True)


@jobs_group.command("show")
@click.argument("job_id")
@json_option
@client_options
def jobs_show(job_id: str, as_json: bool, server, token, ca_bundle) -> None:
    """One job: why it waits, attempts, members and the event timeline."""
    with api_client(server, token, ca_bundle) as client:
        job = client.get(f"/jobs/{job_id}")
    if as_json:
        print_json(job)
        return
    # Launch (issue 5): why it waits, attempts and members come from app.cli.jobs_launch_cmd.
    from tuneplane.app.cli.jobs_launch_cmd import echo_idle, echo_launch, echo_waiting

    click.echo(f"job {job['id']} {job['state']}: {job['state_reason']}")
    echo_waiting(job)
    echo_idle(job)
    shown = {
        **job,
        "memory_per_node": humanize.size(job["memory_per_node"]),
        "created_at": f"{humanize.ago(job['created_at'])} ({str(job['created_at'])[:19]})",
    }
    for label in (
        "owner",
        "team",
        "fleet",
        "backend",
        "input_summary",
        "nodes",
        "gpus_per_node",
        "cpus_per_node",
        "memory_per_node",
        "max_attempts",
        "priority",
        "preview_id",
        "digest",
        "retry_key",
        "created_at",
    ):
        click.echo(f"  {label:<16} {shown[label]}")
    echo_launch(job)
    # Telemetry (issue 11): whether every member's metrics arrived, and what could not be stored.
    from tuneplane.app.cli.telemetry_cmd import echo_health

    with api_client(server, token, ca_bundle) as client:
        echo_health(client.get(f"/jobs/{job_id}/metrics/health"))
    click.echo("events:")
    for event in job["events"]:
        click.echo(
            f"  {str(event['at'])[:19]}  {event['from_state'] or '-':>9} → {event['to_state']:<9} "
            f"{event['reason']}"
        )


@click.command("login")
@click.option("--server", required=True, help="Server URL, e.g. https://tuneplane.example.com")
@click.option("--username", default=None, help="Default: asked.")
@click.option("--password-stdin", is_flag=True, help="Read the password from standard input.")
@click.option("--ca-bundle", default=None, help="CA bundle for a private CA; saved in the config.")
@click.option("--name", default="tuneplane login", show_default=True, help="A name for the token.")
def login_cmd(
    server: str, username: str | None, password_stdin: bool, ca_bundle: str | None, name: str
) -> None:
    """Log in: obtains an API token and writes it, with the server URL, to the config file."""
    from tuneplane.app.client.config import ClientConfig, read_config_file, write_config_file

    username = username or click.prompt("Username")
    password = (
        sys.stdin.readline().rstrip("\n") if password_stdin else click.prompt("Password", hide_input=True)
    )
    config = ClientConfig(server=server.rstrip("/"), token=None, ca_bundle=ca_bundle)
    with ApiClient(config, require_token=False) as client:
        issued = client.post("/api/tokens", json={"username": username, "password": password, "name": name})
    current = read_config_file()
    values = {**current, "server": config.server, "token": issued["token"]}
    if ca_bundle:
        values["ca_bundle"] = ca_bundle
    path = write_config_file(values)
    click.echo(
        f"logged in to {config.server} as {issued['username']} ({issued['role']}); token saved in {path}"
    )


COMMANDS = [preview_cmd, confirm_cmd, submit_cmd, jobs_group, login_cmd]
