"""Process settings: where the database is and where local state lives, validated once at start."""

from __future__ import annotations

import os
from pathlib import Path

import platformdirs
from pydantic import BaseModel, ConfigDict, field_validator

ENV_DATABASE_URL = "TUNEPLANE_DATABASE_URL"
ENV_DATA_DIR = "TUNEPLANE_DATA_DIR"


class SettingsError(ValueError):
    """A setting is present but unusable; the message names it."""


class Settings(BaseModel):
    model_config = ConfigDict(frozen=True)

    database_url: str | None = None
    data_dir: Path

    @field_validator("database_url")
    @classmethod
    def _url_is_postgres(cls, value: str | None) -> str | None:
        if value is None or value == "":
            return None
        if not value.startswith(("postgresql://", "postgres://")) and "=" not in value:
            raise ValueError("must be a postgresql:// URL or a libpq key=value string")
        return value

    @property
    def embedded(self) -> bool:
        return self.database_url is None

    @property
    def pgdata(self) -> Path:
        return self.data_dir / "postgres"

    @property
    def blob_dir(self) -> Path:
        return self.data_dir / "blobs"

    @property
    def log_dir(self) -> Path:
        return self.data_dir / "logs"


def default_data_dir() -> Path:
    return Path(platformdirs.user_data_dir("tuneplane", appauthor=False))


def load_settings(database_url: str | None = None, data_dir: str | Path | None = None) -> Settings:
    """Flags win over the environment, the environment over defaults."""
    url = database_url or os.environ.get(ENV_DATABASE_URL) or None
    raw_dir = data_dir or os.environ.get(ENV_DATA_DIR) or default_data_dir()
    try:
        settings = Settings(database_url=url, data_dir=Path(raw_dir).expanduser().resolve())
    except ValueError as exc:
        field = "TUNEPLANE_DATABASE_URL" if "database_url" in str(exc) else "settings"
        raise SettingsError(f"{field}: {exc.errors()[0]['msg'] if hasattr(exc, 'errors') else exc}") from exc
    if settings.data_dir.exists() and not settings.data_dir.is_dir():
        raise SettingsError(f"{ENV_DATA_DIR}: {settings.data_dir} exists and is not a directory")
    return settings
