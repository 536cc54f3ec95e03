"""Where a team webhook may be sent (docs/teams.md "Webhooks"): the target policy, decided where the
delivery connects.

Any user may make a team and register its webhooks, and the worker that delivers them sits inside the
installation's network: without a policy a webhook is a port scanner with the worker's reach (cloud
metadata at 169.254.169.254, databases on 10.x, services on loopback). So:
  - a URL is `https://host[:port]/…` (plain `http://` only to a host or address the operator allowed), no
    credentials in it, a port 1–65535;
  - every address the host resolves to must be a public unicast one: loopback, private (RFC 1918),
    shared (100.64/10), link-local (169.254/16, fe80::/10), unique-local (fc00::/7), unspecified,
    multicast, reserved and documentation addresses are refused, IPv4-mapped IPv6 judged as the IPv4;
  - the operator opens hosts or networks explicitly with TUNEPLANE_WEBHOOK_ALLOW (`tuneplane up
    --webhook-allow`, comma-separated names and CIDRs, e.g. `127.0.0.1,10.20.0.0/16,hooks.internal`).
The check runs at registration (a clear 400) and again at every connect: the delivery resolves the name
itself, checks each address and connects to the very address it checked (`connect`), so a name that
resolves to a private address later (DNS rebinding) is refused too. A refusal is `TargetRefused`; what a
team admin sees of a failed try is only a coarse class (`failure_class`), never the exception's text.
"""

from __future__ import annotations

import functools
import http.client
import ipaddress
import os
import socket
import ssl
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import urlsplit

ENV_ALLOW = "TUNEPLANE_WEBHOOK_ALLOW"
IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

# The coarse classes of a failed try (team_event_delivery_result keeps only these).
REFUSED, CONNECT_FAILED = "refused by policy", "connection failed"
TLS_FAILED, TIMEOUT = "TLS failed", "timeout"


class TargetRefused(Exception):
    """The URL or an address it resolves to is outside the policy; the message says which rule."""


@dataclass(frozen=True)
class Policy:
    """The operator's allow-list: networks and host names that are reachable whatever the defaults say."""

    networks: tuple[IPNetwork, ...] = ()
    hosts: frozenset[str] = frozenset()

    @classmethod
    def parse(cls, text: str) -> Policy:
        networks: list[IPNetwork] = []
        hosts: set[str] = set()
        for item in (part.strip() for part in text.replace(" ", ",").split(",")):
            if not item:
                continue
            try:
                networks.append(ipaddress.ip_network(item, strict=False))
            except ValueError:
                if not item.isascii() or "/" in item:
                    raise ValueError(f"{ENV_ALLOW}: {item!r} is neither a host name nor a CIDR") from None
                hosts.add(item.lower().rstrip("."))
        return cls(tuple(networks), frozenset(hosts))

    def opens_host(self, host: str) -> bool:
        if host.lower().rstrip(".") in self.hosts:
            return True
        address = _literal(host)
        return address is not None and self.opens_address(address)

    def opens_address(self, address: IPAddress) -> bool:
        return any(address.version == n.version and address in n for n in self.networks)


def current_policy() -> Policy:
    """The policy of this process (read each time: the console and the worker inherit `up`'s setting)."""
    return Policy.parse(os.environ.get(ENV_ALLOW, ""))


def _literal(host: str) -> IPAddress | None:
    try:
        return ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return None


def refused_kind(address: IPAddress) -> str | None:
    """Why an address is not a public unicast one (None: it is)."""
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    for kind, hit in (
        ("unspecified", address.is_unspecified),
        ("loopback", address.is_loopback),
        ("link-local", address.is_link_local),
        ("multicast", address.is_multicast),
        ("unique-local", isinstance(address, ipaddress.IPv6Address) and address in _UNIQUE_LOCAL),
        ("shared (100.64/10)", isinstance(address, ipaddress.IPv4Address) and address in _SHARED),
        ("private", address.is_private),
        ("reserved", not address.is_global),
    ):
        if hit:
            return kind
    return None


_UNIQUE_LOCAL = ipaddress.ip_network("fc00::/7")
_SHARED = ipaddress.ip_network("100.64.0.0/10")


def _getaddrinfo(host: str, port: int) -> list[str]:
    return [info[4][0] for info in socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)]


# The resolver: a module attribute so that tests can map a name to any address without DNS.
resolve: Callable[[str, int], list[str]] = _getaddrinfo


@dataclass(frozen=True)
class Target:
    scheme: str
    host: str
    port: int


def check_url(url: str, policy: Policy) -> Target:
    """The URL's shape under the policy (no network): scheme, no credentials, a port 1–65535."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        raise TargetRefused("the port must be 1 to 65535") from None
    if parts.scheme not in ("https", "http") or not parts.hostname:
        raise TargetRefused("the URL must be https://host/…")
    if parts.username is not None or parts.password is not None or "@" in parts.netloc:
        raise TargetRefused("the URL must not carry credentials (user:password@)")
    if port is not None and not 1 <= port <= 65535:
        raise TargetRefused("the port must be 1 to 65535")
    host = parts.hostname
    if parts.scheme == "http" and not policy.opens_host(host):
        raise TargetRefused("plain http:// only to a host the operator allowed (TUNEPLANE_WEBHOOK_ALLOW)")
    return Target(parts.scheme, host, port or (443 if parts.scheme == "https" else 80))


def allowed_addresses(host: str, port: int, policy: Policy) -> list[IPAddress]:
    """Every address `host` resolves to, each within the policy, else TargetRefused naming the first."""
    opened = host.lower().rstrip(".") in policy.hosts  # a name the operator allowed: wherever it points
    literal = _literal(host)
    try:
        names = [str(literal)] if literal is not None else resolve(host, port)
    except (OSError, UnicodeError):
        raise TargetRefused(f"{host} does not resolve") from None
    addresses = [ipaddress.ip_address(name.split("%", 1)[0]) for name in names]
    if not addresses:
        raise TargetRefused(f"{host} does not resolve")
    for address in addresses:
        kind = refused_kind(address)
        if kind is not None and not opened and not policy.opens_address(address):
            said = "is" if literal else "resolves to"
            raise TargetRefused(f"{host} {said} a {kind} address")
    return addresses


def check_target(url: str, policy: Policy) -> Target:
    """Registration's check: the URL's shape and where its host resolves now."""
    target = check_url(url, policy)
    allowed_addresses(target.host, target.port, policy)
    return target


def connect(host: str, port: int, timeout: float | None, policy: Policy) -> socket.socket:
    """A socket to one of `host`'s allowed addresses, resolved and checked here, at connect time."""
    last: OSError | None = None
    for address in allowed_addresses(host, port, policy):
        try:
            return socket.create_connection((str(address), port), timeout=timeout)
        except OSError as exc:
            last = exc
    raise last or OSError(f"no address of {host} answered")


class _CheckedHTTP(http.client.HTTPConnection):
    def __init__(self, *args, policy: Policy, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._policy = policy

    def connect(self) -> None:
        self.sock = connect(self.host, self.port, self.timeout, self._policy)


class _CheckedHTTPS(http.client.HTTPSConnection):
    def __init__(self, *args, policy: Policy, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._policy = policy

    def connect(self) -> None:
        sock = connect(self.host, self.port, self.timeout, self._policy)
        self.sock = self._context.wrap_socket(sock, server_hostname=self.host)


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """A redirect is an answer, not a place to send the event (its target was never checked)."""

    def redirect_request(self, *args, **kwargs):
        return None


class _HTTPHandler(urllib.request.HTTPHandler):
    def __init__(self, policy: Policy) -> None:
        super().__init__()
        self.policy = policy

    def http_open(self, req):
        return self.do_open(functools.partial(_CheckedHTTP, policy=self.policy), req)


class _HTTPSHandler(urllib.request.HTTPSHandler):
    def __init__(self, policy: Policy) -> None:
        super().__init__(context=ssl.create_default_context())
        self.policy = policy

    def https_open(self, req):
        return self.do_open(functools.partial(_CheckedHTTPS, policy=self.policy), req, context=self._context)


def opener(policy: Policy) -> urllib.request.OpenerDirector:
    """An opener that connects only through `connect`: no proxy from the environment (it would connect
    for us, to an address we never checked), no redirects, no other scheme."""
    director = urllib.request.OpenerDirector()
    handlers = (_HTTPHandler(policy), _HTTPSHandler(policy), _NoRedirect())
    for handler in (*handlers, urllib.request.HTTPErrorProcessor(), urllib.request.HTTPDefaultErrorHandler()):
        director.add_handler(handler)
    return director


def failure_class(exc: BaseException) -> str:
    """The coarse class a team admin sees for a try without an HTTP status (never the exception's text,
    which would map what the worker's host can reach)."""
    reason = exc.reason if isinstance(exc, urllib.error.URLError) else exc
    if isinstance(reason, TargetRefused):
        return REFUSED
    if isinstance(reason, ssl.SSLError | ssl.CertificateError):
        return TLS_FAILED
    if isinstance(reason, TimeoutError | socket.timeout):
        return TIMEOUT
    return CONNECT_FAILED
