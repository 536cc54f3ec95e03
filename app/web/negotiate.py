"""Content negotiation: the same endpoint answers HTML to a browser and JSON to `Accept: application/json`."""

from __future__ import annotations

import datetime as dt
import decimal
import json
import uuid
from pathlib import Path
from typing import Any

from flask import Response, render_template, request


def wants_json() -> bool:
    best = request.accept_mimetypes.best_match(["text/html", "application/json"])
    if best == "application/json":
        return True
    return request.accept_mimetypes["application/json"] > request.accept_mimetypes["text/html"]


def _default(value: Any) -> Any:
    if isinstance(value, dt.datetime | dt.date):
        return value.isoformat()
    if isinstance(value, dt.timedelta):
        return value.total_seconds()
    if isinstance(value, decimal.Decimal):
        return float(value)
    if isinstance(value, uuid.UUID | Path):
        return str(value)
    if isinstance(value, set | frozenset | tuple):
        return list(value)
    if hasattr(value, "model_dump"):
        return value.model_dump(mode="json")
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


def json_response(data: Any, status: int = 200) -> Response:
    return Response(json.dumps(data, default=_default), status=status, mimetype="application/json")


def respond(template: str, data: dict, status: int = 200, json_data: Any = None) -> Response | tuple:
    """Render `template` with `data` for a browser, or `json_data` (default: `data`) as JSON."""
    if wants_json():
        return json_response(data if json_data is None else json_data, status)
    return render_template(template, **data), status
