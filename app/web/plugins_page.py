"""The Plugins page: each plugin under its purpose, with capabilities and where it executes."""

from __future__ import annotations

from flask import Blueprint

from tuneplane.app.plugins import load_plugins
from tuneplane.app.web.negotiate import respond

bp = Blueprint("plugins", __name__)


@bp.get("/plugins")
def plugins():
    groups = load_plugins()
    data = {purpose: [item.as_json() for item in items] for purpose, items in groups.items()}
    return respond("plugins.html", {"groups": groups}, json_data={"plugins": data})
