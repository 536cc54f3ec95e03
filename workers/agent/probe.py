"""What PREPARE checks that the control connection cannot prove.

Peer network: every agent listens on a small TCP probe port (reported to the control plane as report
kind `probe`); a member's node must be able to open a connection to every other member's node at the
address and port PREPARE lists, and rank 0's node must be able to bind MASTER_PORT. Shared storage:
where the fleet declares `shared_path`, it must exist here and take a write, fsync, read and delete.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import selectors
import socket
import threading
import time
from pathlib import Path

PROBE_GREETING = b"tuneplane-probe\n"


class ProbeServer:
    """Answers every connection with a greeting line and closes it, from a thread of its own: when a gang
    starts, every member's node connects to every other one (N × (N-1) connections, all within a few
    milliseconds, while each agent is busy preparing its own member), and a plain accept/send/close costs
    a fraction of what the same answer costs through asyncio streams on the agent's event loop."""

    def __init__(self, host: str = "0.0.0.0", port: int = 0) -> None:
        self.host = host
        self.port = port
        self.sock: socket.socket | None = None
        self.thread: threading.Thread | None = None

    async def start(self) -> int:
        family, _, _, _, address = socket.getaddrinfo(
            self.host or None, self.port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
        self.sock = socket.create_server(address, family=family, backlog=256)
        self.port = self.sock.getsockname()[1]
        self.thread = threading.Thread(target=self._serve, args=(self.sock,), name="probe", daemon=True)
        self.thread.start()
        return self.port

    @staticmethod
    def _serve(sock: socket.socket) -> None:
        while True:
            try:
                conn, _ = sock.accept()
            except OSError:  # closed (close() shuts it down, which wakes accept)
                return
            with conn, contextlib.suppress(OSError):
                conn.sendall(PROBE_GREETING)

    async def close(self) -> None:
        if self.sock is not None:
            with contextlib.suppress(OSError):
                self.sock.shutdown(socket.SHUT_RDWR)
            self.sock.close()
        if self.thread is not None:
            self.thread.join(2)


def reach_all(targets: list[tuple[str, int]], timeout: float = 3.0) -> list[str | None]:
    """For each (address, port): None when the probe there answered its greeting, else what went wrong.
    All of them at once from the calling thread (one selector; at most PEER_CHECKS_AT_ONCE sockets open):
    one round trip, not N-1. `timeout` bounds the connect, and then the answer, of each."""
    results: list[str | None] = [None] * len(targets)
    for first in range(0, len(targets), PEER_CHECKS_AT_ONCE):
        batch = range(first, min(first + PEER_CHECKS_AT_ONCE, len(targets)))
        _reach_batch(targets, batch, results, timeout)
    return results


def _reach_batch(targets: list[tuple[str, int]], batch: range, results: list, timeout: float) -> None:
    selector = selectors.DefaultSelector()
    open_sockets: dict[int, socket.socket] = {}
    deadlines: dict[int, float] = {}
    replies: dict[int, bytes] = {}
    try:
        for i in batch:
            address, port = targets[i]
            try:
                family, kind, proto, _, where = socket.getaddrinfo(address, port, type=socket.SOCK_STREAM)[0]
                sock = socket.socket(family, kind, proto)
            except OSError as exc:
                results[i] = _failure(exc)
                continue
            sock.setblocking(False)
            open_sockets[i] = sock
            error = sock.connect_ex(where)
            if error not in (0, errno.EINPROGRESS):
                results[i] = _failure(OSError(error, os.strerror(error)))
                continue
            deadlines[i] = time.monotonic() + timeout
            selector.register(sock, selectors.EVENT_WRITE, i)
        while deadlines:
            wait = max(0.0, min(deadlines.values()) - time.monotonic())
            for key, _events in selector.select(wait):
                i, sock = key.data, key.fileobj
                if i not in replies:  # connected (or refused)
                    error = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
                    if error:
                        results[i] = _failure(OSError(error, os.strerror(error)))
                        _done(selector, deadlines, i, sock)
                        continue
                    replies[i] = b""
                    deadlines[i] = time.monotonic() + timeout
                    selector.modify(sock, selectors.EVENT_READ, i)
                    continue
                try:
                    data = sock.recv(64)
                except OSError as exc:
                    results[i] = f"connected but no probe answer ({type(exc).__name__})"
                    _done(selector, deadlines, i, sock)
                    continue
                replies[i] += data
                if data and b"\n" not in replies[i] and len(replies[i]) < 64:
                    continue
                line = replies[i].split(b"\n", 1)[0] + (b"\n" if b"\n" in replies[i] else b"")
                if line != PROBE_GREETING:
                    results[i] = f"something else listens there (answered {line[:40]!r})"
                _done(selector, deadlines, i, sock)
            now = time.monotonic()
            for i in [i for i, deadline in deadlines.items() if deadline <= now]:
                results[i] = (
                    "connected but no probe answer (TimeoutError)" if i in replies else "TimeoutError"
                )
                _done(selector, deadlines, i, open_sockets[i])
    finally:
        selector.close()
        for sock in open_sockets.values():
            sock.close()


def _done(selector: selectors.BaseSelector, deadlines: dict[int, float], i: int, sock: socket.socket) -> None:
    selector.unregister(sock)
    del deadlines[i]


def _failure(exc: OSError) -> str:
    return f"{type(exc).__name__}: {exc}".rstrip(": ")


def can_bind(port: int) -> str | None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("0.0.0.0", port))
        except OSError as exc:
            return str(exc)
    return None


# How many probe connections one member's check has open at once: every pair of a gang is checked (N × (N-1)
# connections in all), and one after the other a node would wait N-1 round trips to its peers, each of them
# as busy starting its own member: side by side, the check costs about one.
PEER_CHECKS_AT_ONCE = 32


def check_peers(rank: int, peers: list[dict], master_port: int | None) -> dict:
    """Every other member's probe answers (all at once, reach_all) and, for rank 0, MASTER_PORT binds.
    Blocking: up to reach_all's timeout on an unreachable peer."""
    others = [peer for peer in peers if peer.get("rank") != rank]
    results: list[dict] = []
    targets: list[tuple[str, int]] = []
    for peer in others:
        address, port = peer.get("address"), peer.get("probe_port")
        results.append({"rank": peer.get("rank"), "node": peer.get("node"), "address": address, "port": port})
        if not address or not port:
            results[-1]["error"] = "its agent reported no probe address/port"
        else:
            targets.append((str(address), int(port)))
    reached = iter(reach_all(targets) if targets else [])
    for entry in results:
        error = entry.get("error") or next(reached)
        entry["ok"] = error is None
        if error:
            entry["error"] = error
    problems = [
        f"cannot reach rank {e['rank']} on {e['node']} at {e['address']}:{e['port']} ({e['error']})"
        for e in results
        if not e["ok"]
    ]
    check: dict = {"ok": not problems, "peers": results, "checked_at": time.time()}
    if rank == 0 and master_port:
        error = can_bind(int(master_port))
        check["master_port"] = {
            "port": master_port,
            "ok": error is None,
            **({"error": error} if error else {}),
        }
        if error:
            check["ok"] = False
            problems.append(f"rank 0 cannot bind MASTER_PORT {master_port} ({error})")
    if problems:
        check["error"] = "; ".join(problems)
    return check


def storage_check(shared_path: str | None, who: str) -> dict | None:
    if not shared_path:
        return None
    path = Path(shared_path)
    check: dict = {"path": shared_path, "checked_at": time.time()}
    if not path.is_dir():
        return {
            **check,
            "ok": False,
            "error": f"shared path {shared_path} is not mounted here (no such directory)",
        }
    probe = path / f".tuneplane-check-{who}-{secrets.token_hex(4)}"
    payload = secrets.token_bytes(64)
    try:
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.write(fd, payload)
            os.fsync(fd)
        finally:
            os.close(fd)
        if probe.read_bytes() != payload:
            return {
                **check,
                "ok": False,
                "error": f"shared path {shared_path} returned other bytes than written",
            }
    except OSError as exc:
        return {
            **check,
            "ok": False,
            "error": f"shared path {shared_path} is not writable here ({exc.strerror})",
        }
    finally:
        with contextlib.suppress(OSError):
            probe.unlink()
    return {**check, "ok": True}
