"""The usage report as a table: the one place that turns usage_report's rows (sql/functions/usage.sql) into
the columns and cells the Usage page shows, its CSV export writes and `tuneplane usage` prints, so the
three can never disagree."""

from __future__ import annotations

import csv
import datetime as dt
import io
import re
from decimal import ROUND_HALF_UP, Decimal

from tuneplane.app.errors import Refusal

GROUPINGS = ("team", "user", "job", "day")
# The key columns of each grouping (usage_report fills the others with NULL).
KEYS = {"team": ["team"], "user": ["team", "user"], "job": ["team", "user", "job"], "day": ["day", "team"]}
# GPU- and CPU-seconds as whole numbers beside the hours: hours to three decimals show a 3-second job as
# 0.001 and a 1-second one as 0.000 (issue 34). They are the only cells that are numbers, not text.
FIGURES = ["members", "GPU-hours", "GPU-seconds", "charged GPU-hours", "CPU-hours", "CPU-seconds",
           "lost GPU-hours", "idle GPU-hours", "cost"]  # fmt: skip
_RELATIVE = re.compile(r"([0-9]{1,6})([hdw])\Z")  # ASCII digits: `\d` would read `３０d` as 30 days
_UNITS = {"h": dt.timedelta(hours=1), "d": dt.timedelta(days=1), "w": dt.timedelta(weeks=1)}
DEFAULT_SINCE = "30d"


def parse_when(raw: str | None, field: str, default: str | None) -> dt.datetime | None:
    """`30d`, `24h`, `2w` (before now) or an ISO date/time (UTC unless it says otherwise); 400 naming the
    field for anything else."""
    text = (raw or "").strip() or default
    if text is None:
        return None
    now = dt.datetime.now(dt.UTC)
    match = _RELATIVE.match(text)
    if match:
        return now - int(match.group(1)) * _UNITS[match.group(2)]
    try:
        if not text.isascii():
            raise ValueError(text)
        when = dt.datetime.fromisoformat(text)
    except ValueError:
        raise Refusal(f"{field} must be like 30d, 24h, 2w or an ISO date (2026-11-01)", status=400,
                      field=field) from None  # fmt: skip
    return when if when.tzinfo else when.replace(tzinfo=dt.UTC)


def _hours(seconds: Decimal | None) -> str:
    return f"{(seconds or Decimal(0)) / 3600:.3f}"


def _seconds(seconds: Decimal | None) -> int:
    """Whole seconds, half up (the ledger's intervals have microseconds)."""
    return int((seconds or Decimal(0)).quantize(Decimal(1), rounding=ROUND_HALF_UP))


def table(rows: list[dict], by: str) -> dict:
    """{"columns": [...], "rows": [[cell, …], …]} with every cell a string, as shown, but the GPU- and
    CPU-seconds, integers (JSON numbers; the CSV and the CLI print them as they are)."""
    keys = KEYS[by]
    out = []
    for r in rows:
        key_cells = {"team": r["team"] or "", "user": r["username"] or "", "job": str(r["job_id"] or ""),
                     "day": r["day"].isoformat() if r["day"] else ""}  # fmt: skip
        cost = "" if r["cost"] is None else f"{r['cost']:.2f} {r['currency']}"
        out.append(
            [key_cells[k] for k in keys]
            + [str(r["members"]), _hours(r["gpu_seconds"]), _seconds(r["gpu_seconds"]),
               _hours(r["charged_gpu_seconds"]), _hours(r["cpu_seconds"]), _seconds(r["cpu_seconds"]),
               _hours(r["lost_gpu_seconds"]), _hours(r["idle_gpu_seconds"]), cost]
        )  # fmt: skip
    return {"columns": keys + FIGURES, "rows": out}


def chart(day_rows: list[dict]) -> dict:
    """GPU-hours per team per UTC day, or CPU-hours when no GPU was used (a CPU-only installation):
    {"days": [epoch seconds], "unit": "GPU-hours"|"CPU-hours", "teams": [{"team", "hours": [...]}]},
    every team with a value for every day (0 where it used nothing)."""
    days = sorted({r["day"] for r in day_rows})
    teams = sorted({r["team"] for r in day_rows})
    gpu = any(r["gpu_seconds"] for r in day_rows)
    column, unit = ("gpu_seconds", "GPU-hours") if gpu else ("cpu_seconds", "CPU-hours")
    value = {(r["day"], r["team"]): float((r[column] or 0) / 3600) for r in day_rows}
    return {
        "days": [int(dt.datetime.combine(d, dt.time(), dt.UTC).timestamp()) for d in days],
        "unit": unit,
        "teams": [{"team": t, "hours": [round(value.get((d, t), 0.0), 3) for d in days]} for t in teams],
    }


def to_csv(shown: dict) -> str:
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(shown["columns"])
    writer.writerows(shown["rows"])
    return buffer.getvalue()
