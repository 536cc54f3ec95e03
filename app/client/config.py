"""Where a client command finds its server and token: flags, then env, then the config file.

The config file is TOML (`TUNEPLANE_CONFIG`, default `~/.config/tuneplane/config.toml`):
    server = "http://127.0.0.1:8080"
    token = "tpu_…"
    ca_bundle = "/path/to/ca.pem"   # optional, for a private CA
"""

from __future__ import annotations

import os
import tomllib
from dataclasses import dataclass
from pathlib import Path

import tomli_w

ENV_SERVER = "TUNEPLANE_SERVER"
ENV_TOKEN = "TUNEPLANE_TOKEN"
ENV_CONFIG = "TUNEPLANE_CONFIG"
ENV_CA_BUNDLE = "TUNEPLANE_CA_BUNDLE"


@dataclass(frozen=True)
class ClientConfig:
    server: str | None
    token: str | None
    ca_bundle: str | None = None


def config_path() -> Path:
    raw = os.environ.get(ENV_CONFIG)
    return Path(raw).expanduser() if raw else Path.home() / ".config" / "tuneplane" / "config.toml"


def read_config_file(path: Path | None = None) -> dict:
    path = path or config_path()
    try:
        with open(path, "rb") as handle:
            return tomllib.load(handle)
    except FileNotFoundError:
        return {}
    except tomllib.TOMLDecodeError as exc:
        raise ValueError(f"{path}: not valid TOML ({exc})") from exc


def write_config_file(values: dict, path: Path | None = None) -> Path:
    """Write the config atomically with mode 0600 (it holds a token)."""
    path = path or config_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as handle:
        tomli_w.dump({k: v for k, v in values.items() if v is not None}, handle)
    os.replace(tmp, path)
    return path


def resolve(
    server: str | None = None, token: str | None = None, ca_bundle: str | None = None
) -> ClientConfig:
    file_values = read_config_file()
    return ClientConfig(
        server=(server or os.environ.get(ENV_SERVER) or file_values.get("server") or None),
        token=(token or os.environ.get(ENV_TOKEN) or file_values.get("token") or None),
        ca_bundle=(ca_bundle or os.environ.get(ENV_CA_BUNDLE) or file_values.get("ca_bundle") or None),
    )
