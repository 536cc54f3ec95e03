"""The console's landing page."""

from __future__ import annotations

from flask import Blueprint

from app.web.negotiate import respond

bp = Blueprint("home", __name__)


@bp.get("/")
def index():
    return respond("home.html", {"title": "TunePlane"})
