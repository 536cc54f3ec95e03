"""Shared set-up for the fleet and node tests: a node fleet, tokens and enrolled nodes made through the
same stored functions the gateway and the CLI use."""

from __future__ import annotations

import datetime as dt

from tuneplane.app.db import Database
from tuneplane.app.security import new_token, token_hash


def make_fleet(db: Database, name: str = "gpu") -> dict:
    return db.call("create_fleet", name, "node", None, None)[0]


def make_token(db: Database, fleet: str = "gpu", ttl: dt.timedelta = dt.timedelta(hours=1)) -> str:
    plaintext, digest = new_token("tpe")
    db.call("create_enrollment_token", fleet, digest, ttl, "test")
    return plaintext


def enroll(db: Database, token: str, name: str) -> tuple[dict, str]:
    """(enroll_node's row, the node's credential plaintext)."""
    credential, digest = new_token("tpn")
    row = db.call("enroll_node", token_hash(token), name, digest, "127.0.0.1")[0]
    return row, credential


def fast_thresholds(
    db: Database,
    *,
    heartbeat: float = 0.3,
    stale: float = 1.5,
    lost: float = 3.0,
    rotate: float | None = None,
    grace: float | None = None,
) -> None:
    seconds = dt.timedelta
    db.call(
        "configure_node_settings",
        seconds(seconds=heartbeat),
        seconds(seconds=stale),
        seconds(seconds=lost),
        seconds(seconds=rotate) if rotate else None,
        seconds(seconds=grace) if grace else None,
    )


def events(db: Database, kind: str | None = None) -> list[dict]:
    if kind is None:
        return db.fetch_all("SELECT * FROM v_node_events ORDER BY id")
    return db.fetch_all("SELECT * FROM v_node_events WHERE kind = %s ORDER BY id", (kind,))


def simulated_capacity(gpus: int = 2) -> dict:
    """What `capacity.detect(simulate_gpus=gpus)` reports, without asking the container runtimes: their
    `podman info` waits on podman's storage lock, which the image tests hold for long stretches when the
    suite runs in parallel (a capacity report 15 s late failed a log-shipping test in CI). The runtime
    probe has its own tests (tests/unit/test_agent_local.py)."""
    from tuneplane.workers.agent import capacity

    return {
        "cpus": capacity.cpu_count(),
        "memory_bytes": capacity.memory_bytes(),
        "gpus": capacity.simulated_gpus(gpus),
        "agent_version": "test",
        "container_runtimes": [],
        "hostname": "test-node",
    }
