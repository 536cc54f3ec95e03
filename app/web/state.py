"""Per-app state the blueprints share: the database pool and the settings."""

from __future__ import annotations

from flask import current_app

from tuneplane.app.db import Database


def get_db() -> Database:
    return current_app.extensions["tuneplane_db"]
