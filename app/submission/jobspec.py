"""JobSpec: what a user asks for. Exactly one input kind, resources, fleet, env, attempts, priority,
preemption and resume.

Unknown fields are errors everywhere. A validation failure becomes a Refusal (HTTP 422) whose fields
name each offending field by its dotted path (`resources.gpus_per_node`).
"""

from __future__ import annotations

import math
import re
from pathlib import PurePosixPath
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from tuneplane.app.errors import Refusal
from tuneplane.app.submission.images import ImageRefError, normalise_image_ref

SHA256_REF = re.compile(r"^(sha256:)?([0-9a-f]{64})$")
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")
NAME = re.compile(r"^[a-z0-9][a-z0-9_-]{0,62}$")
_MEMORY = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([KMGTP]?)(i?B?)?\s*$", re.IGNORECASE)
_UNITS = {"": 1, "K": 1024, "M": 1024**2, "G": 1024**3, "T": 1024**4, "P": 1024**5}
LAUNCHERS = ("script", "torchrun")
# One requirement: a PEP 508 name with optional extras, version specifiers and markers. Options (`-e`,
# `--index-url`), URLs and paths are refused: the lock comes from the index the server is configured with.
REQUIREMENT = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*(\[[A-Za-z0-9._, -]*\])?\s*([<>=!~;][^\n\r@]*)?$")
PYTHON_VERSION = re.compile(r"^3\.\d{1,2}$")
MAX_MEMORY = 1024**5
# Every variable reaches the member's process environment through execve, whose arguments and
# environment together must fit ARG_MAX (2 MiB on Linux, and at most 128 KiB per string); the runner
# adds its own. A spec over these bounds could preview but never start.
MAX_ENV_VARS = 256
MAX_ENV_BYTES = 128 * 1024

ParamValue = str | int | float | bool


def parse_memory(value: Any) -> int:
    """Bytes from an int or a size such as 16G, 16Gi, 16GB, 512M (all binary: 1G = 1024³ bytes)."""
    if isinstance(value, bool):
        raise ValueError("memory must be a number of bytes or a size such as 16G")
    if isinstance(value, int):
        if value < 0:
            raise ValueError("memory cannot be negative")
        return value
    if isinstance(value, float) and value.is_integer() and value >= 0:
        return int(value)
    if isinstance(value, str) and len(value) <= 40:
        match = _MEMORY.match(value)
        if match:
            number, unit = float(match.group(1)), match.group(2).upper()
            if number * _UNITS[unit] > MAX_MEMORY:
                raise ValueError("memory must be at most 1 PiB")
            return int(number * _UNITS[unit])
    raise ValueError("memory must be a number of bytes or a size such as 16G, 512M, 1.5T")


class StrictModel(BaseModel):
    # strict: `"nodes": true` or `"max_attempts": "2"` is refused rather than coerced (the dialog's form
    # fields are converted to numbers before validation, naming a field that is not one).
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, str_strip_whitespace=True, strict=True)


class RecipeInput(StrictModel):
    name: str = Field(description="a registered integration of kind recipe, e.g. demo")
    params: dict[str, Any] = Field(default_factory=dict)

    @field_validator("params")
    @classmethod
    def _params(cls, value: dict[str, Any]) -> dict[str, Any]:
        for key, item in value.items():
            if not isinstance(item, ParamValue):
                raise ValueError(f"{key}: a parameter is a string, number or boolean")
            if isinstance(item, float) and not math.isfinite(item):
                raise ValueError(f"{key}: a parameter must be finite")
        return value

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        if not NAME.match(value):
            raise ValueError("must be a lowercase integration name such as demo")
        return value


class SourceInput(StrictModel):
    archive: str = Field(description="sha256 of an uploaded source archive (POST /sources)")
    entrypoint: str = Field(min_length=1, max_length=4096)
    integration: Literal["script", "torchrun"] = "script"

    @field_validator("archive")
    @classmethod
    def _archive(cls, value: str) -> str:
        match = SHA256_REF.match(value.lower())
        if not match:
            raise ValueError("must be sha256:<64 hex digits> of an uploaded archive")
        return "sha256:" + match.group(2)


class ImageInput(StrictModel):
    ref: str = Field(min_length=1, max_length=512)
    command: str = Field(min_length=1, max_length=4096)
    integration: Literal["script", "torchrun"] = "script"

    @field_validator("ref")
    @classmethod
    def _ref(cls, value: str) -> str:
        try:
            normalise_image_ref(value)
        except ImageRefError as exc:
            raise ValueError(str(exc)) from exc
        return value


class Resources(StrictModel):
    nodes: int = Field(1, ge=1, le=4096)
    gpus_per_node: int = Field(0, ge=0, le=64)
    cpus_per_node: int = Field(1, ge=1, le=4096)
    memory_per_node: Annotated[int, Field(ge=0, le=MAX_MEMORY)] = 1024**3
    # Wall-clock limit in minutes; Slurm fleets check it against the partition's MaxTime at preview and pass
    # it to sbatch (--time). Other backends do not enforce it yet (docs/slurm.md).
    time_limit_minutes: int | None = Field(None, ge=1, le=525600)

    @field_validator("memory_per_node", mode="before")
    @classmethod
    def _memory(cls, value: Any) -> int:
        return parse_memory(value)


class InputRef(StrictModel):
    """A reference to an artifact to place into the job's input directory (pinned at preview)."""

    name: str = Field(min_length=1, max_length=128)
    artifact: str = Field(min_length=1, max_length=256)
    path: str | None = Field(None, max_length=1024)


# An output becomes an artifact of that name; `logs` is the member's own logs artifact and NAME.N are the
# checkpoints published of output NAME while the member runs (docs/artifacts.md).
OUTPUT_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,40}$")
RESERVED_OUTPUT_NAMES = ("logs",)


class OutputSpec(StrictModel):
    name: str = Field(min_length=1, max_length=128)
    path: str = Field(min_length=1, max_length=1024)
    # How the finished directory reaches the platform (artifacts issue): "object" uploads it to the
    # server's blob store, "shared" registers it on the fleet's shared mount; unset: the fleet's default
    # (object delivery when declared, else its shared mount). The preview refuses what the fleet lacks.
    delivery: Literal["object", "shared"] | None = None

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        if not OUTPUT_NAME.match(value):
            raise ValueError("must be 1-41 letters, digits, _ or - (starting with a letter or digit)")
        if value in RESERVED_OUTPUT_NAMES:
            raise ValueError(f"{value!r} is reserved for the member's own logs artifact")
        return value

    @field_validator("path")
    @classmethod
    def _relative(cls, value: str) -> str:
        parts = value.replace("\\", "/").split("/")
        if value.startswith("/") or ".." in parts:
            raise ValueError("must be a relative path inside the output directory, without ..")
        return value


class EnvironmentSpec(StrictModel):
    """`environment:` in a JobSpec (docs/runtimes.md)."""

    base: Literal["isolated", "node"] | None = None
    packages: list[str] = Field(default_factory=list, max_length=256)
    requirements: str | None = Field(None, min_length=1, max_length=1024)
    python: str | None = None

    @field_validator("packages")
    @classmethod
    def _packages(cls, value: list[str]) -> list[str]:
        for index, item in enumerate(value):
            if not REQUIREMENT.match(item) or len(item) > 512:
                raise ValueError(
                    f"{item!r} (item {index}) is not a requirement such as transformers>=4.40 "
                    "(a name, extras, versions, markers; no options, URLs or paths)"
                )
        return value

    @field_validator("requirements")
    @classmethod
    def _requirements(cls, value: str | None) -> str | None:
        if value is None:
            return None
        path = PurePosixPath(value)
        if (
            path.is_absolute()
            or ".." in path.parts
            or not (path.name.endswith(".txt") or path.name == "pyproject.toml")
        ):
            raise ValueError(
                "must be a relative path inside the source archive to a requirements file (*.txt) "
                "or a pyproject.toml (with uv.lock beside it)"
            )
        return value

    @field_validator("python")
    @classmethod
    def _python(cls, value: str | None) -> str | None:
        if value is not None and not PYTHON_VERSION.match(value):
            raise ValueError("must be a Python minor version such as 3.11")
        return value

    @model_validator(mode="after")
    def _one_source(self) -> EnvironmentSpec:
        if self.packages and self.requirements:
            raise ValueError("give packages or requirements, not both")
        return self

    @property
    def builds(self) -> bool:
        """Whether a lock is resolved and an environment built (else: the node's interpreter as it is)."""
        return bool(self.packages or self.requirements)

    @property
    def effective_base(self) -> str:
        return self.base or ("isolated" if self.builds else "node")


class PreemptionSpec(StrictModel):
    """How the job is asked to stop (docs/preemption.md): its grace (capped by the fleet's maximum; unset:
    the installation's default), the signal its workload gets besides the file and the SDK, and how many
    preemptions it accepts (unset: the installation's default)."""

    grace_seconds: int | None = Field(None, ge=0, le=86400)
    signal: Literal["SIGTERM", "SIGINT", "SIGHUP", "SIGUSR1", "SIGUSR2"] = "SIGTERM"
    max_preemptions: int | None = Field(None, ge=0, le=1000)


class JobSpec(StrictModel):
    recipe: RecipeInput | None = None
    source: SourceInput | None = None
    image: ImageInput | None = None
    resources: Resources = Field(default_factory=Resources)
    fleet: str | None = None
    # The team the job belongs to (docs/teams.md); None: the user's default team.
    team: str | None = None
    env: dict[str, Annotated[str, Field(max_length=32768)]] = Field(
        default_factory=dict, max_length=MAX_ENV_VARS
    )
    max_attempts: int = Field(1, ge=1, le=20)
    # A priority class (scavenger, low, normal, high, urgent: priority_classes, an operator may re-map
    # their integers) or an integer from -1000 to 1000 (docs/preemption.md).
    priority: int | str = "normal"
    # Whether the planner may preempt it; unset: the class decides (normal and below are preemptible).
    # Only preemptible jobs borrow idle GPUs above their team's guarantee (docs/teams.md).
    preemptible: bool | None = None
    preemption: PreemptionSpec = Field(default_factory=PreemptionSpec)
    inputs: list[InputRef] = Field(default_factory=list, max_length=64)
    outputs: list[OutputSpec] = Field(default_factory=list, max_length=64)
    environment: EnvironmentSpec | None = None
    # Where every later attempt starts (docs/preemption.md): "latest" (the job's newest verified
    # checkpoint), "none" (from scratch), or a checkpoint reference pinned at preview (JOB/NAME, sha256:…).
    resume: str = Field("latest", min_length=1, max_length=256)
    # After an idle-GPU reclaim (docs/idle.md) the job ends unless this is set: then it is queued again
    # and resumes from its checkpoint, as after any preemption.
    resume_when_idle_reclaimed: bool = False

    @field_validator("outputs")
    @classmethod
    def _unique_outputs(cls, value: list[OutputSpec]) -> list[OutputSpec]:
        names = [o.name for o in value]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ValueError(f"output names must be unique ({', '.join(twice)} given twice)")
        return value

    @field_validator("priority", mode="wrap")
    @classmethod
    def _priority(cls, value: Any, handler: Any) -> int | str:
        # One message for one field (a plain union would name each branch: priority.int, priority.str).
        if isinstance(value, bool) or not isinstance(value, int | str):
            raise ValueError(
                "must be a priority class name (scavenger, low, normal, high, urgent) or an integer"
            )
        if isinstance(value, int) and not -1000 <= value <= 1000:
            raise ValueError("must be an integer from -1000 to 1000")
        if isinstance(value, str) and not re.match(r"^[a-z][a-z0-9_-]{0,31}$", value):
            raise ValueError("must be a priority class name such as normal or urgent")
        return value

    @field_validator("fleet")
    @classmethod
    def _fleet(cls, value: str | None) -> str | None:
        if value in (None, ""):
            return None
        if not re.match(r"^[a-z0-9][a-z0-9-]{0,62}$", value):
            raise ValueError("must be a fleet name (lowercase letters, digits, -)")
        return value

    @field_validator("team")
    @classmethod
    def _team(cls, value: str | None) -> str | None:
        if value in (None, ""):
            return None
        if not re.match(r"^[a-z0-9][a-z0-9_.-]{1,62}$", value):
            raise ValueError("must be a team name (2-63 of a-z, 0-9, _ . -)")
        return value

    @field_validator("env")
    @classmethod
    def _env(cls, value: dict[str, str]) -> dict[str, str]:
        for key in value:
            if not ENV_NAME.match(key):
                raise ValueError(f"{key!r} is not an environment variable name")
            if key.upper().startswith("TUNEPLANE_"):
                raise ValueError(f"{key}: TUNEPLANE_* variables are set by the runner")
        total = sum(len(k.encode()) + len(v.encode()) + 2 for k, v in value.items())
        if total > MAX_ENV_BYTES:
            raise ValueError(
                f"the variables take {total} bytes; at most {MAX_ENV_BYTES} fit a process environment"
            )
        return value

    @model_validator(mode="after")
    def _exactly_one_input(self) -> JobSpec:
        given = [k for k in ("recipe", "source", "image") if getattr(self, k) is not None]
        if len(given) != 1:
            found = ", ".join(given) if given else "none"
            raise ValueError(f"give exactly one input: recipe, source or image (found {found})")
        if self.environment is not None and self.image is not None and self.environment.builds:
            raise ValueError(
                "environment: an image job brings its own environment (packages need recipe or source)"
            )
        if self.environment is not None and self.environment.requirements and self.source is None:
            raise ValueError("environment.requirements: a requirements file is read from the source archive")
        return self

    @property
    def input_kind(self) -> str:
        return next(k for k in ("recipe", "source", "image") if getattr(self, k) is not None)


def refusal_from_validation(exc: ValidationError, prefix: str = "") -> Refusal:
    """One Refusal naming every offending field (dotted path) with pydantic's message."""
    fields: dict[str, str] = {}
    for error in exc.errors(include_url=False):
        path = ".".join(str(p) for p in error["loc"] if p != "__root__")
        name = (prefix + path) if path else (prefix.rstrip(".") or "input")
        message = error["msg"]
        if error["type"] == "extra_forbidden":
            message = "unknown field"
        message = message.removeprefix("Value error, ")
        fields.setdefault(name, message)
    first_name, first_message = next(iter(fields.items()))
    refusal = Refusal(f"invalid JobSpec: {first_name}: {first_message}", status=422, field=first_name)
    refusal.fields.update(fields)
    return refusal


def parse_jobspec(data: Any) -> JobSpec:
    if not isinstance(data, dict):
        raise Refusal("a JobSpec is a JSON object", status=422, field="spec")
    try:
        return JobSpec.model_validate(data)
    except ValidationError as exc:
        raise refusal_from_validation(exc) from exc
