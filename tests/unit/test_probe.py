"""PREPARE's checks of what the control connection cannot prove: peers reachable on their probe port,
MASTER_PORT free on rank 0's node, the shared path mounted and writable. Real sockets, real files."""

from __future__ import annotations

import asyncio
import os
import socket
from pathlib import Path

import pytest

from tuneplane.workers.agent.probe import (
    PEER_CHECKS_AT_ONCE,
    PROBE_GREETING,
    ProbeServer,
    can_bind,
    check_peers,
    reach_all,
    storage_check,
)


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_peer_with_a_probe_is_reachable_and_one_without_is_named() -> None:
    async def scenario() -> dict:
        probe = ProbeServer("127.0.0.1", 0)
        port = await probe.start()
        try:
            peers = [
                {"rank": 0, "node": "me", "address": "127.0.0.1", "probe_port": 1},
                {"rank": 1, "node": "good", "address": "127.0.0.1", "probe_port": port},
                {"rank": 2, "node": "bad", "address": "127.0.0.1", "probe_port": _closed_port()},
                {"rank": 3, "node": "old", "address": "127.0.0.1", "probe_port": None},
            ]
            return await asyncio.to_thread(check_peers, 0, peers, None)
        finally:
            await probe.close()

    check = asyncio.run(scenario())
    assert check["ok"] is False
    assert [(p["node"], p["ok"]) for p in check["peers"]] == [("good", True), ("bad", False), ("old", False)]
    assert "cannot reach rank 2 on bad" in check["error"] and "rank 3 on old" in check["error"]


def test_something_else_on_the_probe_port_is_not_taken_for_a_peer() -> None:
    async def scenario() -> dict:
        async def other(_r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
            w.write(b"SSH-2.0-OpenSSH\r\n")
            await w.drain()
            w.close()

        server = await asyncio.start_server(other, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        try:
            return await asyncio.to_thread(
                check_peers, 1, [{"rank": 0, "node": "x", "address": "127.0.0.1", "probe_port": port}], None
            )
        finally:
            server.close()

    check = asyncio.run(scenario())
    assert check["ok"] is False and "something else listens there" in check["error"]


def test_a_member_reaches_its_peers_side_by_side_not_one_after_the_other() -> None:
    # A probe that answers only once every peer's connection is open: checked one after the other, the
    # first peer would wait for an answer that never comes (each peer is as busy starting its own member).
    async def scenario() -> dict:
        everyone = asyncio.Event()
        connected = 0

        async def answer_when_all_connected(_r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
            nonlocal connected
            connected += 1
            if connected == 5:
                everyone.set()
            await everyone.wait()
            w.write(PROBE_GREETING)
            await w.drain()
            w.close()

        server = await asyncio.start_server(answer_when_all_connected, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        peers = [{"rank": r, "node": f"n{r}", "address": "127.0.0.1", "probe_port": port} for r in range(6)]
        try:
            return await asyncio.to_thread(check_peers, 0, peers, None)
        finally:
            server.close()

    check = asyncio.run(scenario())
    assert check["ok"] is True, check
    assert [p["rank"] for p in check["peers"]] == [1, 2, 3, 4, 5]


def test_reach_all_names_each_way_a_peer_fails_and_opens_no_more_sockets_than_allowed() -> None:
    """The probe's answers come from its own thread, so these run with no event loop at all: more peers
    than PEER_CHECKS_AT_ONCE (checked in batches), one that accepts and never answers (bounded by the
    timeout), a closed port, a name that does not resolve."""
    probe = ProbeServer("127.0.0.1", 0)
    port = asyncio.run(probe.start())
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen()  # the kernel completes the handshake; nobody ever writes
        targets = [("127.0.0.1", port)] * (PEER_CHECKS_AT_ONCE + 8)
        targets += [("127.0.0.1", silent.getsockname()[1]), ("127.0.0.1", _closed_port())]
        targets.append(("no-such-host.invalid", port))
        results = reach_all(targets, timeout=0.5)
    assert results[: PEER_CHECKS_AT_ONCE + 8] == [None] * (PEER_CHECKS_AT_ONCE + 8)
    silent_result, closed_result, unresolved = results[-3:]
    assert silent_result == "connected but no probe answer (TimeoutError)"
    assert closed_result.startswith("ConnectionRefusedError")
    assert unresolved.startswith("gaierror")
    asyncio.run(probe.close())
    assert probe.thread is not None and not probe.thread.is_alive()
    assert reach_all([("127.0.0.1", port)], timeout=0.5)[0].startswith("ConnectionRefusedError")


def test_rank_zero_fails_when_master_port_is_taken() -> None:
    with socket.socket() as busy:
        busy.bind(("0.0.0.0", 0))
        busy.listen()
        port = busy.getsockname()[1]
        assert can_bind(port) is not None
        check = check_peers(0, [], port)
    assert check["ok"] is False and check["master_port"]["ok"] is False
    assert f"cannot bind MASTER_PORT {port}" in check["error"]
    assert check_peers(1, [], port)["ok"] is True  # only rank 0 binds it


def test_shared_storage_must_exist_and_take_a_write(tmp_path: Path) -> None:
    assert storage_check(None, "n") is None
    missing = storage_check(str(tmp_path / "nfs"), "n")
    assert missing["ok"] is False and "not mounted here" in missing["error"]
    good = storage_check(str(tmp_path), "n")
    assert good["ok"] is True and list(tmp_path.iterdir()) == []  # the probe file is gone again


@pytest.mark.skipif(os.geteuid() == 0, reason="root can write to a read-only directory")
def test_a_read_only_shared_path_fails_the_check(tmp_path: Path) -> None:
    tmp_path.chmod(0o500)
    try:
        ro = storage_check(str(tmp_path), "n")
        assert ro["ok"] is False and "not writable" in ro["error"]
    finally:
        tmp_path.chmod(0o700)
