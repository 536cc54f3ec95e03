"""Test setup for submission tests: users, fleets and nodes written straight into the core tables.

Fleet and node management is another area's; these rows stand in for what its agents would report.
"""

from __future__ import annotations

from tuneplane.app.db import Database
from tuneplane.app.security import hash_password

GIB = 1024**3


def add_user(db: Database, name: str, role: str = "user", password: str | None = None) -> int:
    return db.call("create_user", name, hash_password(password) if password else None, role)[0]["id"]


def add_fleet(db: Database, name: str, backend: str = "node") -> int:
    row = db.fetch_one("INSERT INTO fleets (name, backend) VALUES (%s, %s) RETURNING id", (name, backend))
    return row["id"]


def add_node(
    db: Database,
    fleet_id: int,
    name: str,
    *,
    cpus: int = 8,
    memory: int = 32 * GIB,
    gpus: int = 0,
    runtimes: tuple[str, ...] = (),
    state: str = "active",
    simulated: bool = False,
) -> int:
    with db.transaction() as conn:
        node_id = conn.execute(
            "INSERT INTO nodes (fleet_id, name, cpus, memory_bytes, container_runtimes, scheduling_state,"
            " last_heartbeat_at) VALUES (%s, %s, %s, %s, %s, %s, now()) RETURNING id",
            (fleet_id, name, cpus, memory, list(runtimes), state),
        ).fetchone()["id"]
        for index in range(gpus):
            conn.execute(
                "INSERT INTO node_gpus (node_id, gpu_index, model, memory_bytes, simulated)"
                " VALUES (%s, %s, 'Test GPU', %s, %s)",
                (node_id, index, 80 * GIB, simulated),
            )
    return node_id


def one_local_fleet(db: Database, name: str = "local", gpus: int = 0) -> int:
    fleet = add_fleet(db, name)
    add_node(db, fleet, f"{name}-1", gpus=gpus)
    return fleet
