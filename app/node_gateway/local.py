"""What `tuneplane up` adds for nodes: the node gateway (console port + 1) and one local agent enrolled
into a fleet named `local`. The agent's state lives under the data directory and its credential is reused
by the next `up`; a one-time enrollment token is made only when there is no usable credential."""

from __future__ import annotations

import datetime as dt
import time
from pathlib import Path

from tuneplane.app import db_functions as fn
from tuneplane.app.components import (
    UpContext,
    http_ok,
    node_gateway_url,
    telemetry_gateway_url,
    tuneplane_argv,
)
from tuneplane.app.db import Database
from tuneplane.app.errors import Refusal
from tuneplane.app.node_gateway.config import ENV_NODE_GATEWAY_URL
from tuneplane.app.node_gateway.protocol import ENROLL_TOKEN_PREFIX
from tuneplane.app.s3store import SERVER_ONLY_ENV
from tuneplane.app.security import new_token, token_hash
from tuneplane.app.supervisor import Component
from tuneplane.workers.agent.credential import FileCredentialStore
from tuneplane.workers.agent.directories import CREDENTIAL_FILE, StateError

LOCAL_FLEET = "local"
LOCAL_NODE = "local"


def local_node_dirs(data_dir: Path) -> tuple[Path, Path]:
    """(state dir, work dir): siblings, so no workload directory contains the credential."""
    return data_dir / "node" / "state", data_dir / "node" / "work"


def ensure_local_enrollment(database_url: str, state_dir: Path) -> str | None:
    """Create fleet `local` if absent; a fresh enrollment token unless the state dir's credential is live."""
    db = Database(database_url, max_size=1, name="tuneplane-up-node")
    try:
        if db.fetch_one("SELECT 1 AS x FROM fleets WHERE name = %s", (LOCAL_FLEET,)) is None:
            try:
                db.call(fn.create_fleet, LOCAL_FLEET, "node", None, None)
            except Refusal as exc:
                if exc.status != 409:  # another `up` made it a moment ago
                    raise
        path = state_dir / CREDENTIAL_FILE
        try:
            stored = FileCredentialStore(path).load() if path.exists() else None
        except StateError:
            stored = None
        if stored is not None:
            live = db.fetch_one(
                "SELECT 1 AS x FROM node_credentials WHERE credential_hash = %s AND revoked_at IS NULL"
                " AND (grace_until IS NULL OR grace_until > now())",
                (token_hash(stored.credential),),
            )
            if live is not None:
                return None
            # A credential this database does not know (a new embedded database): keep it aside, enroll anew.
            path.rename(path.with_name(f"{path.name}.unknown-{int(time.time())}"))
        plaintext, digest = new_token(ENROLL_TOKEN_PREFIX)
        db.call(fn.create_enrollment_token, LOCAL_FLEET, digest, dt.timedelta(hours=1), "tuneplane up")
        return plaintext
    finally:
        db.close()


def node_components(ctx: UpContext) -> list[Component]:
    url = node_gateway_url(ctx)
    state_dir, work_dir = local_node_dirs(ctx.data_dir)
    gateway = Component(
        "node-gateway",
        tuneplane_argv("node-gateway", "--host", ctx.host, "--port", str(ctx.node_gateway_port)),
        env=ctx.env(),
        ready=lambda: http_ok(f"{url}/healthz"),
    )
    # The local agent's members ship telemetry to the telemetry gateway (console port + 2).
    env = {**ctx.env(), ENV_NODE_GATEWAY_URL: url, "TUNEPLANE_TELEMETRY_URL": telemetry_gateway_url(ctx)}
    token = ensure_local_enrollment(ctx.database_url, state_dir)
    if token:
        # Through the environment rather than argv, so the token does not show in `ps`.
        env["TUNEPLANE_ENROLL_TOKEN"] = token
    agent = Component(
        "node",
        tuneplane_argv(
            "node", "--state-dir", str(state_dir), "--work-dir", str(work_dir), "--name", LOCAL_NODE
        ),
        env=env,
        ready=lambda: (state_dir / CREDENTIAL_FILE).exists() and local_node_reported(ctx.database_url),
        # A node never holds the store's keys (presigned URLs only), even on the server's machine.
        withhold_env=SERVER_ONLY_ENV,
    )
    return [gateway, agent]


def local_node_reported(database_url: str) -> bool:
    """The local node is connected and has reported its capacity: before that a preview finds no fleet
    that can hold a job, so `up` does not say it is up until then."""
    import psycopg

    from tuneplane.app.db import connect

    try:
        with connect(database_url, application_name="tuneplane-up-ready") as conn:
            row = conn.execute(
                "SELECT count(*) AS n FROM nodes n JOIN fleets f ON f.id = n.fleet_id"
                " WHERE f.name = %s AND n.name = %s AND n.cpus > 0"
                " AND node_connectivity(n.last_heartbeat_at) = 'connected'",
                (LOCAL_FLEET, LOCAL_NODE),
            ).fetchone()
    except psycopg.Error:
        return False
    return row["n"] > 0
