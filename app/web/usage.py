"""The Usage page and its API: who used which GPUs, from the usage ledger (sql/functions/usage.sql).

GET /usage[?team=T&since=30d&until=…&by=team|user|job|day]   the page (chart, table) or JSON
GET /usage.csv[?same]                                           exactly the table the page shows, as CSV
GET /usage/prices                                               prices per GPU-hour (every user may read)
POST /usage/prices  fleet, gpu_model, price (empty: remove), currency   installation admins

What a user may see is decided by usage_report (their teams; an installation admin every team).
"""

from __future__ import annotations

from decimal import Decimal

from flask import Blueprint, Response, flash, redirect, request, url_for
from pydantic import BaseModel, ConfigDict, Field, field_validator

from tuneplane.app import db_functions as fn
from tuneplane.app import usage_report
from tuneplane.app.errors import Refusal
from tuneplane.app.web.auth import current_user, login_required
from tuneplane.app.web.limits import parse_body
from tuneplane.app.web.negotiate import json_response, respond, wants_json
from tuneplane.app.web.state import get_db

bp = Blueprint("usage", __name__)


def _question() -> dict:
    by = (request.args.get("by") or "team").strip()
    if by not in usage_report.GROUPINGS:
        raise Refusal("by must be team, user, job or day", status=400, field="by")
    team = (request.args.get("team") or "").strip() or None
    if team is not None and len(team) > 63:
        raise Refusal("team is at most 63 characters", status=400, field="team")
    return {
        "by": by,
        "team": team,
        "since": usage_report.parse_when(request.args.get("since"), "since", usage_report.DEFAULT_SINCE),
        "until": usage_report.parse_when(request.args.get("until"), "until", None),
    }


def _shown(q: dict) -> dict:
    rows = get_db().call(fn.usage_report, current_user().id, q["by"], q["team"], q["since"], q["until"])
    return usage_report.table(rows, q["by"])


@bp.get("/usage")
@login_required
def usage_page():
    q = _question()
    shown = _shown(q)
    day_rows = get_db().call(fn.usage_report, current_user().id, "day", q["team"], q["since"], q["until"])
    data = {
        "by": q["by"],
        "team": q["team"],
        "since": q["since"],
        "until": q["until"],
        "table": shown,
        "chart": usage_report.chart(day_rows),
        "teams": [r["name"] for r in get_db().call(fn.usage_teams_of, current_user().id)],
        "args": {k: v for k, v in request.args.items() if k in ("team", "since", "until", "by")},
        "prices": _prices(),
    }
    return respond("usage.html", data)


@bp.get("/usage.csv")
@login_required
def usage_csv():
    q = _question()
    body = usage_report.to_csv(_shown(q))
    name = f"usage-by-{q['by']}-{q['since']:%Y%m%d}.csv"
    disposition = f'attachment; filename="{name}"'
    return Response(body, mimetype="text/csv", headers={"Content-Disposition": disposition})


class PriceForm(BaseModel):
    model_config = ConfigDict(extra="ignore", str_strip_whitespace=True)
    fleet: str = Field(max_length=200)
    gpu_model: str = Field("", max_length=200)
    price: Decimal | None = Field(None, ge=0, le=1_000_000, decimal_places=6)
    currency: str = Field("USD", pattern=r"^[A-Z]{3}$")

    @field_validator("price", mode="before")
    @classmethod
    def _decimal(cls, value: object) -> object:
        # Money travels as text (`"3.50"`) or a JSON number; empty removes the price. ASCII only:
        # Decimal() would read full-width digits.
        if value == "":
            return None
        if isinstance(value, bool) or not isinstance(value, str | int | float):
            return value
        text = str(value).strip()
        if not text.isascii():
            raise ValueError("price must be a decimal number")
        try:
            return Decimal(text)
        except ArithmeticError:
            raise ValueError("price must be a decimal number") from None


def _prices() -> list[dict]:
    return get_db().call(fn.usage_prices_list)


@bp.get("/usage/prices")
@login_required
def usage_prices():
    return json_response({"prices": _prices()})


@bp.post("/usage/prices")
@login_required
def usage_price_set():
    form = parse_body(PriceForm)
    get_db().call(fn.set_usage_price, current_user().id, form.fleet, form.gpu_model or None, form.price,
                  form.currency)  # fmt: skip
    if wants_json():
        return json_response({"prices": _prices()})
    flash(f"price on {form.fleet} {'removed' if form.price is None else 'set'}", "ok")
    return redirect(url_for("usage.usage_page"), 303)
