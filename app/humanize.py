"""Sizes and times as people read them (`1.0 GiB`, `3 min ago`), for the CLI's tables and the console.
Exact numbers stay in JSON answers and `--json` output; these are for display only."""

from __future__ import annotations

import datetime as dt
import math
import re

_UNITS = ("B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB")


def size(value: int | float | None) -> str:
    """Bytes in binary units: 0 B, 512 B, 1.5 KiB, 1.0 GiB."""
    if value is None:
        return "-"
    number = float(value)
    for unit in _UNITS:
        if abs(number) < 1024 or unit == _UNITS[-1]:
            return f"{int(number)} {unit}" if unit == "B" else f"{number:.1f} {unit}"
        number /= 1024
    raise AssertionError("unreachable")


def duration(seconds: float | None) -> str:
    """A span: 45 s, 3 min 5 s, 2 h 10 min, 3 d 4 h."""
    if seconds is None:
        return "-"
    total = round(abs(float(seconds)))
    if total < 60:
        return f"{total} s"
    minutes, secs = divmod(total, 60)
    if minutes < 60:
        return f"{minutes} min {secs} s" if secs else f"{minutes} min"
    hours, minutes = divmod(minutes, 60)
    if hours < 24:
        return f"{hours} h {minutes} min" if minutes else f"{hours} h"
    days, hours = divmod(hours, 24)
    return f"{days} d {hours} h" if hours else f"{days} d"


def utc_minute(when: dt.datetime | str | None) -> str:
    """A moment to the minute in UTC, as the idle-GPU deadline is said everywhere: 2026-12-03 15:10 UTC."""
    if when is None:
        return "-"
    moment = dt.datetime.fromisoformat(when) if isinstance(when, str) else when
    return f"{moment.astimezone(dt.UTC):%Y-%m-%d %H:%M} UTC"


def ago(when: dt.datetime | str | None, now: dt.datetime | None = None) -> str:
    """A moment relative to now (`5 min ago`, `in 2 h`); past a week, the date and time (UTC)."""
    if when is None:
        return "-"
    if isinstance(when, str):
        try:
            when = dt.datetime.fromisoformat(when)
        except ValueError:
            return when
    if when.tzinfo is None:
        when = when.replace(tzinfo=dt.UTC)
    now = now or dt.datetime.now(dt.UTC)
    delta = (now - when).total_seconds()
    if abs(delta) > 7 * 86400:
        return when.astimezone(dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    if abs(delta) < 5:
        return "just now"
    span = duration(delta).split(" ")
    short = " ".join(span[:2])  # the largest unit is enough in a table
    return f"{short} ago" if delta > 0 else f"in {short}"


_DIGITS = re.compile(r"(\d+)")


def natural_key(text: str) -> tuple:
    """Sorts `checkpoint.2` before `checkpoint.10` (numbers in a name compared as numbers)."""
    return tuple(int(part) if part.isdigit() else part for part in _DIGITS.split(text))


def number(value: float | int | None, digits: int = 6) -> str:
    """A metric value at the precision it was written with: 6 significant digits, so the float noise of
    `0.005000000000000001` reads `0.005`; integers stay integers."""
    if value is None:
        return ""
    if isinstance(value, int) or (
        isinstance(value, float) and math.isfinite(value) and value.is_integer() and abs(value) < 1e15
    ):
        return str(int(value))
    if not math.isfinite(value):
        return str(value)
    return f"{value:.{digits}g}"


def epoch_ms_range(first: int, last: int) -> str:
    """A system series' steps (milliseconds since the epoch) as the UTC times they are."""
    start = dt.datetime.fromtimestamp(first / 1000, dt.UTC)
    end = dt.datetime.fromtimestamp(last / 1000, dt.UTC)
    same_day = start.date() == end.date()
    return (
        f"{start:%Y-%m-%d %H:%M:%S}..{end:%H:%M:%S} UTC"
        if same_day
        else (f"{start:%Y-%m-%d %H:%M}..{end:%Y-%m-%d %H:%M} UTC")
    )
