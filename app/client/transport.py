"""What every TunePlane HTTP client checks before it connects, without importing an HTTP library (the
collector's start-up path does not pay for one): plain HTTP only to loopback, TLS verification always on,
and the one error type client commands print as a single line."""

from __future__ import annotations

import ipaddress
import math
from typing import Any
from urllib.parse import urlsplit


class ClientError(Exception):
    def __init__(self, message: str, status: int | None = None, fields: dict | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.fields = fields or {}


def is_loopback_host(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def check_transport(url: str) -> None:
    """Plain HTTP only to loopback; anything else must be HTTPS (verification is never switched off)."""
    parts = urlsplit(url)
    if parts.scheme == "https":
        return
    if parts.scheme == "http" and is_loopback_host(parts.hostname or ""):
        return
    if parts.scheme == "http":
        raise ClientError(
            f"refusing plain HTTP to {parts.hostname}: use https:// (plain HTTP is for loopback only)"
        )
    raise ClientError(f"server URL must start with https:// or http://, got {url!r}")


def verify_setting(ca_bundle: str | None) -> Any:
    return ca_bundle if ca_bundle else True


def proxied(url: str) -> bool:
    """Whether the environment sends requests to this URL through a proxy (as httpx would)."""
    import urllib.request

    parts = urlsplit(url)
    proxies = urllib.request.getproxies()
    if not (proxies.get(parts.scheme) or proxies.get("all")):
        return False
    return not urllib.request.proxy_bypass(parts.hostname or "")


# The longest one Retry-After is waited (seconds): a failover takes seconds (docs/operations.md); a longer
# one is a misconfigured or hostile server, and each client's own deadline still applies.
RETRY_AFTER_MAX_S = 10.0


def retry_after(status: int, value: str | None) -> float | None:
    """The pause a 503 asks for before the same request is sent again (its Retry-After in seconds, 0 to
    RETRY_AFTER_MAX_S), else None: another status, no header, or an HTTP date (TunePlane never sends one).
    TunePlane's servers answer 503 with Retry-After while their database is away (app/reconnect.py); every
    client of theirs (the CLI, the node agent, the collector) reads the header here."""
    if status != 503 or value is None:
        return None
    try:
        seconds = float(value)
    except ValueError:
        return None
    return min(max(seconds, 0.0), RETRY_AFTER_MAX_S) if math.isfinite(seconds) else None
