"""What PREPARE checks that the control connection cannot prove.

Peer network: every agent listens on a small TCP probe port (reported to the control plane as report
kind `probe`); a member's node must be able to open a connection to every other member's node at the
address and port PREPARE lists, and rank 0's node must be able to bind MASTER_PORT. Shared storage:
where the fleet declares `shared_path`, it must exist here and take a write, fsync, read and delete.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import socket
import time
from pathlib import Path

PROBE_GREETING = b"tuneplane-probe\n"


class ProbeServer:
    """Answers every connection with a greeting line and closes it."""

    def __init__(self, host: str = "0.0.0.0", port: int = 0) -> None:
        self.host = host
        self.port = port
        self.server: asyncio.base_events.Server | None = None

    async def start(self) -> int:
        async def answer(_reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            with contextlib.suppress(ConnectionError, OSError):
                writer.write(PROBE_GREETING)
                await writer.drain()
            writer.close()

        self.server = await asyncio.start_server(answer, self.host, self.port, reuse_address=True)
        self.port = self.server.sockets[0].getsockname()[1]
        return self.port

    async def close(self) -> None:
        if self.server is not None:
            self.server.close()
            await self.server.wait_closed()


async def reach(address: str, port: int, timeout: float = 3.0) -> str | None:
    """None when the probe at address:port answered; else what went wrong."""
    try:
        reader, writer = await asyncio.wait_for(asyncio.open_connection(address, port), timeout)
    except (OSError, TimeoutError) as exc:
        return f"{type(exc).__name__}: {exc}".rstrip(": ")
    try:
        greeting = await asyncio.wait_for(reader.readline(), timeout)
    except (OSError, TimeoutError) as exc:
        return f"connected but no probe answer ({type(exc).__name__})"
    finally:
        writer.close()
    if greeting != PROBE_GREETING:
        return f"something else listens there (answered {greeting[:40]!r})"
    return None


def can_bind(port: int) -> str | None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("0.0.0.0", port))
        except OSError as exc:
            return str(exc)
    return None


# How many peers one member's check reaches at once: every pair of a gang is checked (N × (N-1) connections
# in all), and one after the other a node waits N-1 round trips to its peers, each of them as busy starting
# its own member: side by side, the check costs about one.
PEER_CHECKS_AT_ONCE = 32


async def peer_check(rank: int, peers: list[dict], master_port: int | None) -> dict:
    others = [peer for peer in peers if peer.get("rank") != rank]
    limit = asyncio.Semaphore(PEER_CHECKS_AT_ONCE)

    async def check_one(peer: dict) -> dict:
        address, port = peer.get("address"), peer.get("probe_port")
        entry = {"rank": peer.get("rank"), "node": peer.get("node"), "address": address, "port": port}
        if not address or not port:
            error = "its agent reported no probe address/port"
        else:
            async with limit:
                error = await reach(address, int(port))
        entry["ok"] = error is None
        if error:
            entry["error"] = error
        return entry

    results = list(await asyncio.gather(*(check_one(peer) for peer in others)))
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
