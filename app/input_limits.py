"""Input limits shared by the console server and both gateways: what any request may carry at all.

One place decides the generic bounds, before a view or handler reads a value, so that nothing a client
sends reaches PostgreSQL or a recursive parser in a shape that fails as a 500:
  - JSON bodies: at most MAX_JSON_DEPTH levels of nesting (Python's parser and PostgreSQL's jsonb both
    recurse), no NaN/Infinity, integers within PostgreSQL's bigint, strings without NUL or lone surrogates
    (PostgreSQL text refuses NUL; UTF-8 cannot encode a lone surrogate);
  - query parameters and form fields: the same string rules, at most MAX_TEXT_CHARS each, and the
    integer parameters the endpoints take (INT_PARAMS) are integers within their declared range — the
    widest any endpoint accepts, the SQL type of the argument they become at least — so no query
    reaches PostgreSQL with a value its function cannot take. An endpoint may narrow a range further
    (`parse_int` with the range it accepts, or the stored function's check); every range refusal is
    worded the same everywhere (`out_of_range`).
Every refusal is a Refusal (4xx) naming the field; the endpoint's own rules (a JobSpec's ranges, a job
the user may see) come after and stay where they are.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

from tuneplane.app.errors import Refusal, clip

MAX_JSON_DEPTH = 32
MAX_JSON_BYTES = 8 * 1024 * 1024
MAX_TEXT_CHARS = 1024 * 1024
_INTEGER = re.compile(r"([+-]?)0*([0-9]+)\Z")
INT4 = (-(2**31), 2**31 - 1)
INT8 = (-(2**63), 2**63 - 1)

INT4_MAX, INT8_MAX = INT4[1], INT8[1]

# Query parameters that are integers on every endpoint that takes them, with their declared range: the
# widest any endpoint accepts (an endpoint may narrow it). Attempts count from 1 (0: the job page's "no
# attempt shown yet"), member ranks from 0 (both SQL integer); ids are positive bigints; steps any
# bigint. `limit` (None) has no range shared by every endpoint: each one that reads it states its own
# (the jobs list's 1..1000, a log's the stored function's), so that one parameter is refused with one
# range whatever the value.
INT_PARAMS: dict[str, tuple[int, int] | None] = {
    "limit": None, "member": (0, INT4_MAX), "attempt": (0, INT4_MAX), "rank": (0, INT4_MAX),
    "max_points": (1, INT4_MAX), "skip": (0, INT4_MAX), "page": (1, INT4_MAX), "before": (1, INT8_MAX),
    "after": (0, INT8_MAX), "tail": (0, INT8_MAX), "step_from": INT8, "step_to": INT8,
    "series": (1, INT8_MAX), "job": (1, INT8_MAX), "smooth": (1, INT8_MAX),
}  # fmt: skip


def out_of_range(field: str, low: int | str, high: int | str, unit: str = "", status: int = 400) -> Refusal:
    """The one wording of a range refusal (stored functions raise the same sentence)."""
    return Refusal(f"{field} must be between {low} and {high}{' ' + unit if unit else ''}", status, field)


def check_text(value: str, field: str, max_chars: int = MAX_TEXT_CHARS) -> str:
    """`value` unchanged, or a 400 naming `field` when PostgreSQL or UTF-8 could not take it."""
    if "\x00" in value:
        raise Refusal(f"{field} contains a NUL character", status=400, field=field)
    if len(value) > max_chars:
        raise Refusal(f"{field} is longer than {max_chars} characters", status=400, field=field)
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise Refusal(f"{field} is not valid Unicode (a lone surrogate)", status=400, field=field) from None
    return value


def parse_int(raw: str, field: str, low: int, high: int, *, clamp: bool = False) -> int:
    """An integer query parameter or route segment within [low, high], or a 400 naming `field`;
    `clamp`: a value beyond [low, high] is that bound instead (see app.web.limits.query_int)."""
    match = _INTEGER.match(raw.strip())
    # int() accepts underscores and non-ASCII digits (¹ passes isdigit() but not int()) and refuses more
    # than 4,300 digits; an SQL integer is at most 19 ASCII digits, so a longer one is out of any range.
    if not match:
        raise Refusal(f"{field} must be an integer", status=400, field=field)
    sign, digits = match.groups()
    value = int(sign + digits) if len(digits) <= 19 else (low - 1 if sign == "-" else high + 1)
    if low <= value <= high:
        return value
    if clamp:
        return low if value < low else high
    raise out_of_range(field, low, high)


def check_route_value(name: str, value: object) -> None:
    """A route segment: text rules for strings; ids (`…_id`) within bigint, indexes (`…index`) within
    integer — the SQL types they are looked up as — or the route names nothing (404)."""
    if isinstance(value, str):
        check_text(value, name, 4096)
        if not (value.isascii() and value.isdigit()):
            return
        value = int(value)
    if isinstance(value, int):
        high = INT8[1] if name.endswith("_id") else INT4[1] if name.endswith("index") else None
        if high is not None and value > high:
            raise Refusal(f"no such {name}", status=404, field=name)


def check_query(args: Any) -> None:
    """Every query parameter (a MultiDict or aiohttp's MultiDictProxy) against the generic rules, and each
    integer parameter (INT_PARAMS) within its declared range."""
    for key, value in args.items():
        check_text(key, "query parameter name", 200)
        check_text(value, key, 64 * 1024)
        if key in INT_PARAMS and value != "":
            declared = INT_PARAMS[key]
            if declared is None:
                if not _INTEGER.match(value.strip()):
                    raise Refusal(f"{key} must be an integer", status=400, field=key)
            else:
                parse_int(value, key, *declared)


def _refuse_constant(name: str) -> Any:
    raise Refusal(f"the body contains {name}, which JSON does not allow", status=400, field="body")


def load_json(
    raw: bytes | str,
    field: str = "body",
    max_bytes: int = MAX_JSON_BYTES,
    *,
    depth_only: frozenset[str] = frozenset(),
) -> Any:
    """Parse a JSON body within the limits, or refuse with a 4xx naming where it breaks them.

    Under the top-level keys in `depth_only` only the nesting depth is checked (the telemetry gateway
    judges each point's values itself, refusing a bad point alone rather than the batch).
    """
    if len(raw) > max_bytes:
        raise Refusal(f"the JSON body is larger than {max_bytes} bytes", status=413, field=field)
    try:
        value = json.loads(raw, parse_constant=_refuse_constant)
    except RecursionError:
        raise Refusal(
            f"the JSON body is nested more than {MAX_JSON_DEPTH} levels deep", status=400, field=field
        ) from None
    except UnicodeDecodeError:
        raise Refusal("the JSON body is not UTF-8", status=400, field=field) from None
    except ValueError as exc:
        raise Refusal(f"the body is not JSON: {exc}", status=400, field=field) from None
    check_json_value(value, field, depth_only=depth_only)
    return value


def check_json_value(value: Any, field: str = "body", *, depth_only: frozenset[str] = frozenset()) -> Any:
    """Walk a parsed JSON value without recursion: depth, strings, integers and floats within bounds.

    A refusal names the offending value by its dotted path (`resources.nodes`, `env.A`, `points.3.step`).
    """
    stack: list[tuple[Any, str, int, bool]] = [(value, "", 1, True)]
    while stack:
        item, path, depth, values = stack.pop()
        where = path or field
        if isinstance(item, dict):
            if depth > MAX_JSON_DEPTH:
                raise Refusal(f"nested more than {MAX_JSON_DEPTH} levels deep", status=400, field=where)
            for key, child in item.items():
                key_path = f"{path}.{key}" if path else str(key)
                if values:
                    check_text(str(key), clip(ascii(key_path)[1:-1], 120))
                stack.append((child, key_path, depth + 1, values and not (depth == 1 and key in depth_only)))
        elif isinstance(item, list):
            if depth > MAX_JSON_DEPTH:
                raise Refusal(f"nested more than {MAX_JSON_DEPTH} levels deep", status=400, field=where)
            for index, child in enumerate(item):
                stack.append((child, f"{path}.{index}" if path else str(index), depth + 1, values))
        elif not values:
            continue
        elif isinstance(item, str):
            check_text(item, where)
        elif isinstance(item, bool) or item is None:
            continue
        elif isinstance(item, int):
            if not INT8[0] <= item <= INT8[1]:
                raise Refusal(f"{where} is outside the 64-bit integer range", status=400, field=where)
        elif isinstance(item, float) and not math.isfinite(item):
            raise Refusal(f"{where} must be a finite number", status=400, field=where)
    return value
