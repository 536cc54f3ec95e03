"""What only Python can pin: the integration artifact (sha256 of its files), the runtime (Python
environment or normalised image) and the recipe parameters with their defaults applied.

The result is passed as `p_pins` to the stored function create_preview, which owns every other rule.
"""

from __future__ import annotations

import hashlib
import importlib.util
import sys
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

from tuneplane.app.errors import Refusal
from tuneplane.app.input_limits import out_of_range
from tuneplane.app.plugins import Plugin, load_plugins
from tuneplane.app.submission.canonical import digest_of
from tuneplane.app.submission.environments import NODE_PROVIDED, normalise_name, resolve_environment
from tuneplane.app.submission.images import normalise_image_ref, resolve_image_digest
from tuneplane.app.submission.jobspec import JobSpec, OutputSpec

INTEGRATIONS_PACKAGE = "tuneplane.workers.integrations"


@dataclass(frozen=True)
class Integration:
    plugin: Plugin

    @property
    def name(self) -> str:
        return self.plugin.name

    @property
    def kind(self) -> str:
        return self.plugin.details.get("kind", "")

    @property
    def parameters(self) -> dict[str, dict]:
        return self.plugin.details.get("parameters", {})


def integrations() -> dict[str, Integration]:
    found = {}
    for item in load_plugins("integrations").get("integrations", []):
        if item.plugin is not None:
            found[item.plugin.name] = Integration(item.plugin)
    return found


def recipes() -> list[Integration]:
    return [i for i in integrations().values() if i.kind == "recipe"]


def _package_dir(plugin: Plugin) -> Path:
    module = plugin.details.get("module", "")
    package = module.rsplit(".", 1)[0] if "." in module else INTEGRATIONS_PACKAGE
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise Refusal(
            f"integration {plugin.name}: package {package} is not installed", status=422, field="integration"
        )
    return Path(next(iter(spec.submodule_search_locations)))


def artifact_pin(integration: Integration) -> dict:
    """The integration's files with their sha256, and one digest over all of them."""
    base = _package_dir(integration.plugin)
    files: dict[str, str] = {}
    for name in integration.plugin.details.get("files", []):
        path = base / name
        try:
            files[name] = hashlib.sha256(path.read_bytes()).hexdigest()
        except OSError as exc:
            raise Refusal(
                f"integration {integration.name}: artifact file {name} is missing ({exc.strerror})",
                status=422,
                field="integration",
            ) from exc
    if not files:
        raise Refusal(
            f"integration {integration.name} declares no files to pin", status=422, field="integration"
        )
    return {
        "name": integration.name,
        "kind": integration.kind,
        "module": integration.plugin.details.get("module"),
        "files": files,
        "sha256": digest_of(files),
    }


def python_runtime_pin(integration: Integration) -> tuple[dict, list[str]]:
    """The interpreter version and the versions of the packages the integration needs, as installed here.

    A package missing from this environment stays in the pin with version null and a warning: the
    preview says plainly that its version is not pinned.
    """
    packages: dict[str, str | None] = {}
    warnings: list[str] = []
    for name in integration.plugin.details.get("requires", []):
        try:
            packages[name] = version(name)
        except PackageNotFoundError:
            packages[name] = None
            warnings.append(f"{name} is not installed where the server runs: its version is not pinned")
    python = f"{sys.version_info.major}.{sys.version_info.minor}"
    return {
        "kind": "python",
        "implementation": sys.implementation.name,
        "python": python,
        "packages": packages,
    }, warnings


def _coerce_param(name: str, value: Any, meta: dict) -> Any:
    kind = meta.get("type", "str")
    field = f"recipe.params.{name}"
    try:
        if kind == "int":
            if isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()):
                raise ValueError
            coerced: Any = int(value)
        elif kind == "float":
            if isinstance(value, bool):
                raise ValueError
            coerced = float(value)
        elif kind == "bool":
            if isinstance(value, str):
                if value.lower() not in ("true", "false", "1", "0", "yes", "no"):
                    raise ValueError
                coerced = value.lower() in ("true", "1", "yes")
            else:
                coerced = bool(value)
        else:
            coerced = str(value)
    except (TypeError, ValueError):
        raise Refusal(f"{field} must be a {kind}", status=422, field=field) from None
    if kind in ("int", "float"):
        if coerced != coerced or coerced in (float("inf"), float("-inf")):
            raise Refusal(f"{field} must be a finite number", status=422, field=field)
        low, high = meta.get("min"), meta.get("max")
        if (low is not None and coerced < low) or (high is not None and coerced > high):
            raise out_of_range(field, low, high, status=422)
    return coerced


def recipe_params(integration: Integration, given: dict[str, Any]) -> dict[str, Any]:
    declared = integration.parameters
    unknown = sorted(set(given) - set(declared))
    if unknown:
        field = f"recipe.params.{unknown[0]}"
        known = ", ".join(sorted(declared)) or "none"
        raise Refusal(
            f"{field}: recipe {integration.name} has no parameter {unknown[0]} (it has: {known})",
            status=422,
            field=field,
        )
    resolved = {}
    for name, meta in declared.items():
        resolved[name] = _coerce_param(name, given[name], meta) if name in given else meta.get("default")
    return resolved


def with_recipe_outputs(spec: JobSpec) -> JobSpec:
    """The spec with its recipe's declared outputs (details["outputs"]) when it names none itself: the
    demo recipe's checkpoint becomes an artifact without the user having to ask."""
    if spec.recipe is None or spec.outputs:
        return spec
    integration = integrations().get(spec.recipe.name)
    declared = integration.plugin.details.get("outputs") if integration is not None else None
    if not declared:
        return spec
    return spec.model_copy(update={"outputs": [OutputSpec.model_validate(o) for o in declared]})


def with_environment(
    spec: JobSpec, integration: Integration, runtime: dict, open_archive: Any | None
) -> tuple[dict, list[str]]:
    """The Python runtime pin plus the resolved `environment` (lock and digest) the spec asks for.

    An isolated environment must also hold what the integration itself imports (the demo's numpy), so
    those requirements are resolved with the user's; one the node provides (torchrun's torch) needs
    `base: node`."""
    env = spec.environment
    if env is None or not env.builds:
        return runtime, []
    if env.effective_base == "isolated":
        needs = [normalise_name(r) for r in integration.plugin.details.get("requires", [])]
        provided = [r for r in needs if r in NODE_PROVIDED]
        if provided:
            raise Refusal(
                f"environment.base: integration {integration.name} needs {', '.join(provided)} "
                "from the node; "
                "use base: node (an isolated environment never installs torch)",
                status=422,
                field="environment.base",
            )
        if env.packages:
            env = env.model_copy(update={"packages": [*env.packages, *needs]})
    pin, warnings = resolve_environment(env, open_archive)
    assert pin is not None
    if spec.environment.packages:
        pin["requested"] = list(spec.environment.packages)  # as asked (the integration's own added)
    runtime = {**runtime, "environment": pin}
    if env.effective_base == "isolated":
        # The interpreter that runs the member is the environment's, with the lock's packages.
        runtime.update(python=pin["python"], packages={})
    return runtime, warnings


def build_pins(spec: JobSpec, open_archive: Any | None = None) -> dict:
    """The `p_pins` document for create_preview: input, integration, runtime and warnings.

    `open_archive()` opens the spec's source archive (a requirements file inside it)."""
    available = integrations()
    warnings: list[str] = []
    if spec.recipe is not None:
        integration = available.get(spec.recipe.name)
        if integration is None or integration.kind != "recipe":
            names = ", ".join(sorted(i.name for i in available.values() if i.kind == "recipe")) or "none"
            raise Refusal(
                f"no recipe named {spec.recipe.name} (recipes: {names})", status=422, field="recipe.name"
            )
        input_doc: dict[str, Any] = {
            "kind": "recipe",
            "name": integration.name,
            "params": recipe_params(integration, spec.recipe.params),
        }
        runtime, more = python_runtime_pin(integration)
        warnings += more
        runtime, more = with_environment(spec, integration, runtime, open_archive)
        warnings += more
    else:
        launcher = spec.source or spec.image
        assert launcher is not None
        field = "source.integration" if spec.source is not None else "image.integration"
        integration = available.get(launcher.integration)
        if integration is None or integration.kind != "launcher":
            raise Refusal(f"integration {launcher.integration} is not installed", status=422, field=field)
        if spec.source is not None:
            input_doc = {
                "kind": "source",
                "archive": {"sha256": spec.source.archive.removeprefix("sha256:")},
                "entrypoint": spec.source.entrypoint,
                "integration": integration.name,
            }
            runtime, more = python_runtime_pin(integration)
            warnings += more
            runtime, more = with_environment(spec, integration, runtime, open_archive)
            warnings += more
        else:
            assert spec.image is not None
            ref, warning = resolve_image_digest(normalise_image_ref(spec.image.ref))
            if warning:
                warnings.append(warning)
            input_doc = {
                "kind": "image",
                "image": ref.normalised,  # with the digest the registry answered
                "command": spec.image.command,
                "integration": integration.name,
            }
            runtime = {"kind": "image", "image": ref.normalised}
    if spec.resources.gpus_per_node == 0 and integration.name == "torchrun":
        warnings.append("torchrun with 0 GPUs per node runs one CPU process per member (gloo backend)")
    return {
        "input": input_doc,
        "integration": artifact_pin(integration),
        "runtime": runtime,
        "warnings": warnings,
    }
