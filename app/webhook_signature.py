"""The signature of a team webhook's POST (docs/teams.md "Webhooks"): HMAC-SHA256 over
`<unix seconds>.<body bytes>` with the webhook's secret, sent as
`X-TunePlane-Signature: t=<unix seconds>,v1=<hex digest>`. A receiver recomputes it over the raw body,
compares in constant time and refuses a timestamp far from its clock (a replayed old request)."""

from __future__ import annotations

import hashlib
import hmac
import time

SIGNATURE_HEADER = "X-TunePlane-Signature"
EVENT_ID_HEADER = "X-TunePlane-Event-Id"
EVENT_KIND_HEADER = "X-TunePlane-Event-Kind"
# How far a signature's timestamp may be from the receiver's clock.
TOLERANCE_S = 300


def _digest(secret: str, timestamp: int, body: bytes) -> str:
    return hmac.new(secret.encode(), f"{timestamp}.".encode() + body, hashlib.sha256).hexdigest()


def sign(secret: str, body: bytes, timestamp: int | None = None) -> str:
    """The header value for body, signed now (or at timestamp)."""
    t = int(time.time()) if timestamp is None else timestamp
    return f"t={t},v1={_digest(secret, t, body)}"


def verify(secret: str, header: str, body: bytes, *, now: float | None = None) -> bool:
    """Whether header signs body with secret, at a time within TOLERANCE_S of now."""
    fields = dict(part.split("=", 1) for part in header.split(",") if "=" in part)
    try:
        t = int(fields["t"])
    except (KeyError, ValueError):
        return False
    if abs((time.time() if now is None else now) - t) > TOLERANCE_S:
        return False
    return hmac.compare_digest(fields.get("v1", ""), _digest(secret, t, body))
