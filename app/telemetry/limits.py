"""What a single telemetry point may be, checked the same way by the collector and the gateway.

A point that breaks a rule is refused alone (counted with its reason); the rest of its batch is stored.

- step: an integer in [-(2**53 - 1), 2**53 - 1], JavaScript's exact-integer range, so every stored step is
  drawn and exported exactly by the charts;
- name and source: 1-512 characters, no NUL or other C0 control character, no lone surrogate (PostgreSQL
  text and UTF-8 hold neither);
- value: any float64. NaN and ±Infinity are stored as they are (a diverged run's chart shows them as gaps
  with a marker); a number too large for a float64 (an integer of 10**400) is refused.
"""

from __future__ import annotations

import math
import re

import numpy as np

STEP_MAX = 2**53 - 1
STEP_MIN = -STEP_MAX
MAX_NAME_LEN = 512
# Reasons as they are counted and shown (one vocabulary for collector and gateway).
STEP_RANGE = "step outside ±(2^53-1)"
NAME_EMPTY = "empty name"
NAME_LONG = f"name longer than {MAX_NAME_LEN} characters"
NAME_CONTROL = "name holds a NUL or control character"
NAME_ENCODING = "name is not valid Unicode (lone surrogate)"
VALUE_TOO_LARGE = "number too large for a float64"
NOT_A_NUMBER = "value is not a number"
SOURCE_INVALID = "invalid source"

_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")


def name_problem(name: object) -> str | None:
    """Why `name` cannot be a metric name or source, or None."""
    if not isinstance(name, str) or not name:
        return NAME_EMPTY
    if len(name) > MAX_NAME_LEN:
        return NAME_LONG
    if _CONTROL.search(name):
        return NAME_CONTROL
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return NAME_ENCODING
    return None


def step_ok(step: int) -> bool:
    return STEP_MIN <= step <= STEP_MAX


def steps_in_range(steps: np.ndarray) -> np.ndarray:
    """Boolean mask of the steps inside the documented range."""
    return (steps >= STEP_MIN) & (steps <= STEP_MAX)


def scrub(value: object) -> object:
    """A JSON value with strings made storable in jsonb (NUL, control characters and lone surrogates
    replaced), for free-text fields such as a collector's health where refusing would lose points."""
    if isinstance(value, str):
        cleaned = _CONTROL.sub("\ufffd", value)
        return cleaned.encode("utf-8", "replace").decode("utf-8")
    if isinstance(value, dict):
        return {str(scrub(k)): scrub(v) for k, v in value.items()}
    if isinstance(value, list):
        return [scrub(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value
