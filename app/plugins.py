"""The plugin registry: Python entry points grouped by purpose.

A plugin is an entry point in one of the groups below whose object is a `Plugin`. Built-in pieces are
registered the same way in TunePlane's own pyproject.toml, so the console and `tuneplane plugins` show
them next to third-party ones.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from importlib.metadata import entry_points

PURPOSES = {
    "backends": "tuneplane.backends",
    "integrations": "tuneplane.integrations",
    "telemetry_sources": "tuneplane.telemetry_sources",
    "storage": "tuneplane.storage",
}
EXECUTION_PLACES = ("server", "worker", "node", "collector")


@dataclass(frozen=True)
class Plugin:
    name: str
    purpose: str
    description: str
    capabilities: tuple[str, ...] = ()
    executes_on: tuple[str, ...] = ()
    # purpose-specific extras (an integration's parameters, a backend's worker command, …)
    details: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.purpose not in PURPOSES:
            raise ValueError(f"plugin {self.name}: unknown purpose {self.purpose!r}")
        unknown = set(self.executes_on) - set(EXECUTION_PLACES)
        if unknown:
            raise ValueError(f"plugin {self.name}: unknown execution places {sorted(unknown)}")


@dataclass
class LoadedPlugin:
    plugin: Plugin | None
    entry_point: str
    distribution: str | None
    error: str | None = None

    def as_json(self) -> dict:
        data = asdict(self.plugin) if self.plugin else {}
        data.update(entry_point=self.entry_point, distribution=self.distribution, error=self.error)
        return data


def load_plugins(purpose: str | None = None) -> dict[str, list[LoadedPlugin]]:
    """Every registered plugin by purpose; a plugin that fails to load is listed with its error."""
    result: dict[str, list[LoadedPlugin]] = {}
    for key, group in PURPOSES.items():
        if purpose and key != purpose:
            continue
        loaded: list[LoadedPlugin] = []
        for ep in sorted(entry_points(group=group), key=lambda e: e.name):
            dist = ep.dist.name if ep.dist else None
            try:
                obj = ep.load()
                if not isinstance(obj, Plugin):
                    raise TypeError(f"{ep.value} is a {type(obj).__name__}, not a tuneplane Plugin")
                if obj.purpose != key:
                    raise ValueError(f"declares purpose {obj.purpose!r} but is registered under {key!r}")
                loaded.append(LoadedPlugin(obj, ep.value, dist))
            except Exception as exc:  # a broken third-party plugin must not break the listing
                loaded.append(LoadedPlugin(None, ep.value, dist, error=f"{ep.name}: {exc}"))
        result[key] = loaded
    return result
