"""`tuneplane up`'s check, before anything starts, that its three ports are free.

A port already taken used to surface as a child that died and was restarted until `up` gave up, with a
traceback in a log file. Now `up` stops at once with one line naming the port, what holds it (another
TunePlane, or something else) and the flags that choose other ports.
"""

from __future__ import annotations

import errno
import json
import socket
import urllib.request

from tuneplane.app.cli import ExpectedError

FLAGS = {
    "console": "--port",
    "node gateway": "--node-gateway-port",
    "telemetry gateway": "--telemetry-gateway-port",
}


def _bind_error(host: str, port: int) -> OSError | None:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        # As the servers do: a connection in TIME_WAIT does not make the port "taken".
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as exc:
            return exc
    return None


def _who_answers(host: str, port: int) -> str:
    address = "127.0.0.1" if host in ("0.0.0.0", "", "::") else host
    try:
        with urllib.request.urlopen(f"http://{address}:{port}/healthz", timeout=1) as answer:
            body = json.loads(answer.read(4096) or b"{}")
    except (OSError, ValueError):
        return "something that is not TunePlane"
    if isinstance(body, dict) and ("database" in body or "gateway" in body or body.get("ok") is True):
        return "a TunePlane server (is `tuneplane up` already running?)"
    return "something that is not TunePlane"


def check_ports_free(host: str, ports: dict[str, int]) -> None:
    """Raise ExpectedError (one line) for the first of `ports` ({role: port}) that cannot be bound."""
    seen: dict[int, str] = {}
    for role, port in ports.items():
        if not 0 < port < 65536:
            raise ExpectedError(f"the {role} port {port} is not a TCP port; choose one with {FLAGS[role]}")
        if port in seen:
            raise ExpectedError(
                f"the {role} and the {seen[port]} would both use port {port}; "
                f"choose another with {FLAGS[role]}"
            )
        seen[port] = role
    for role, port in ports.items():
        error = _bind_error(host, port)
        if error is None:
            continue
        if error.errno == errno.EADDRINUSE:
            holder = _who_answers(host, port)
            raise ExpectedError(
                f"port {port} on {host} (the {role}) is in use by {holder}; choose free ports with "
                f"--port (console; the gateways default to it + 1 and + 2), --node-gateway-port "
                f"and --telemetry-gateway-port"
            )
        raise ExpectedError(f"cannot listen on {host}:{port} (the {role}): {error.strerror or error}")
