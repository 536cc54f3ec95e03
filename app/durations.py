"""Durations a client writes (`120s`, `15m`, `1h`, `7d`): one parser for every TTL the HTTP API takes.

A duration is a positive number of ASCII digits directly followed by its unit, nothing between: `7 d`,
a full-width `７d`, a bare `0` and a blank are refused, not read as 7 days, zero or "never" (Python's
`\\d` and `int()` accept any Unicode digit, so the pattern is spelled `[0-9]`). The range is the
caller's: a refusal names the field and the range, worded once (input_limits.out_of_range).
"""

from __future__ import annotations

import datetime as dt
import re

from tuneplane.app.errors import Refusal
from tuneplane.app.input_limits import out_of_range

_DURATION = re.compile(r"([0-9]{1,9})([smhd])\Z")
UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
MINUTE = dt.timedelta(minutes=1)


def _spell(delta: dt.timedelta) -> str:
    seconds = int(delta.total_seconds())
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds % size == 0:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


def parse_duration(raw: object, field: str, low: dt.timedelta, high: dt.timedelta) -> dt.timedelta:
    """`raw` (a string like `15m`) as a timedelta within [low, high], else a 400 naming `field`."""
    if not isinstance(raw, str):
        raise Refusal(f"{field} must be a string like 15m, 1h or 7d", status=400, field=field)
    text = raw.strip()
    if not text:
        raise Refusal(f"{field} must not be blank (15m, 1h, 7d)", status=400, field=field)
    match = _DURATION.match(text)
    if not match:
        raise Refusal(
            f"{field} must be a positive number of digits with a unit s, m, h or d (15m, 1h, 7d)",
            status=400,
            field=field,
        )
    delta = dt.timedelta(seconds=int(match.group(1)) * UNITS[match.group(2)])
    if not low <= delta <= high:
        raise out_of_range(field, _spell(low), _spell(high))
    return delta
