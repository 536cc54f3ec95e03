"""The node control gateway process: agents dial out to it; it never dials a node.

One asyncio event loop (aiohttp, see docs/adr/0004-node-gateway-websocket.md) holds every agent's
WebSocket without a thread each. Per session: authenticate the credential (stored function), open a
fenced session, deliver the node's outbox in order, dispatch reports to stored functions, rotate the
credential on schedule. Background loops: heartbeats are written in batches (one statement per flush,
never a NOTIFY); LISTEN on `tuneplane_node_commands` wakes delivery and a short poll backs it up.
(The connectivity events are written by a sweep of the worker, workers/sweeps.py.)
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import datetime as dt
import gc
import ipaddress
import json
import logging
import ssl
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
from aiohttp import WSMsgType, web
from pydantic import ValidationError

from tuneplane.app import __version__, reconnect
from tuneplane.app import db_functions as fn
from tuneplane.app.errors import Refusal, describe_db_error
from tuneplane.app.gateway_limits import gateway_app, request_json
from tuneplane.app.input_limits import load_json
from tuneplane.app.node_gateway import files, launch, protocol
from tuneplane.app.node_gateway.aiodb import AsyncDatabase, jsonb
from tuneplane.app.node_gateway.refusal_audit import RefusalAudit
from tuneplane.app.node_gateway.reports import dispatch_report
from tuneplane.app.security import new_token, token_hash

log = logging.getLogger("tuneplane.node_gateway")

COMMANDS_CHANNEL = "tuneplane_node_commands"
# One claim call takes the commands of at most this many woken sessions, at most CLAIM_PER_NODE each.
CLAIM_SESSIONS_AT_ONCE = 500
CLAIM_PER_NODE = 100
# Database trouble that is nobody's fault and not final (deadlock victim, serialization failure, lost or
# exhausted connection): answered as retryable, never allowed to end a node's control session.
DB_TROUBLE: tuple[type[BaseException], ...] = (psycopg.Error,)  # PoolTimeout is one too


@dataclass
class NodeSession:
    node_id: int
    node: str
    fleet: str
    epoch: int
    credential_id: int
    rotate_due: float  # time.time() at which the credential is due for rotation
    heartbeat_interval: float
    ws: web.WebSocketResponse
    send_lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    last_running: list | None = None
    # Commands claimed for this session and not yet sent, in claim order (Gateway._claim fills it, one
    # sender task per session empties it: a node whose socket is slow holds back only its own commands).
    outbox: collections.deque = field(default_factory=collections.deque)
    sending: bool = False
    rotation_pending: int | None = None
    close_reason: str = ""

    async def send(self, message: dict) -> None:
        async with self.send_lock:
            await self.ws.send_str(json.dumps(message))


def _json_error(refusal: Refusal) -> web.Response:
    return web.json_response(refusal.as_json(), status=refusal.status)


DATABASE_AWAY = "the database is unavailable; try again shortly"


def _database_away(message: str = DATABASE_AWAY, **extra: Any) -> web.Response:
    """503 with Retry-After: the database is restarting or failing over; the agent waits that long."""
    return web.json_response(
        {**Refusal(message, status=503).as_json(), **extra},
        status=503,
        headers={"Retry-After": str(reconnect.RETRY_AFTER_S)},
    )


@web.middleware
async def _database_away_middleware(request: web.Request, handler: Any) -> web.StreamResponse:
    """Any route that meets the database away (the control handshake's authentication, enrollment, files,
    the artifact routes) answers 503 + Retry-After, never 500."""
    try:
        return await handler(request)
    except psycopg.Error as exc:
        if not reconnect.database_away(exc):
            raise
        log.warning("%s %s: the database is away (%s)", request.method, request.path, describe_db_error(exc))
        return _database_away()


def _malformed(what: str, exc: ValidationError) -> Refusal:
    """A 400 naming the first offending field, without echoing the input back."""
    fields = {
        ".".join(str(p) for p in e["loc"]) or "body": e["msg"]
        for e in exc.errors(include_url=False, include_input=False)
    }
    name, message = next(iter(fields.items()))
    refusal = Refusal(f"malformed {what}: {name}: {message}", status=400, field=name)
    refusal.fields.update(fields)
    return refusal


def _bearer(request: web.Request) -> str | None:
    header = request.headers.get("Authorization", "")
    if header.startswith("Bearer "):
        return header[7:].strip() or None
    return None


class Gateway:
    def __init__(
        self,
        db: AsyncDatabase,
        *,
        liveness_db: AsyncDatabase | None = None,
        name: str = "node-gateway",
        poll_interval: float = 2.0,
        blob_dir: Path | None = None,
    ) -> None:
        self.db = db
        # Heartbeat flushes get their own small pool, so a burst of commands and
        # reports cannot starve liveness (connections are a budget: each use gets its own small pool).
        self.liveness_db = liveness_db or db
        # The blob store (Settings.blob_dir) serves capsules and the artifact routes; None: neither.
        self.blob_dir = blob_dir
        self.name = name
        self.poll_interval = poll_interval
        self.sessions: dict[int, NodeSession] = {}
        # Nodes woken (NOTIFY, poll, a new session) whose commands the claim task has not taken yet.
        self.to_claim: set[int] = set()
        self.claiming = False
        self.pending_heartbeats: dict[int, dict] = {}
        self.settings: dict[str, float] = {
            "heartbeat_interval": 10.0,
            "stale_after": 30.0,
            "credential_rotate_after": 86400.0,
        }
        self.tasks: list[asyncio.Task] = []
        self.stats: dict[str, float] = {
            "commands_delivered": 0,
            "heartbeats_written": 0,
            "heartbeat_flushes": 0,
            # The longest the event loop was late to wake a 0.1 s timer (ms): every session waits that long.
            "loop_lag_max_ms": 0.0,
            "flush_max_ms": 0.0,
            "gc_full_max_ms": 0.0,
        }
        self._gc_started = 0.0
        gc.callbacks.append(self._gc_timer)
        self.refusal_audit = RefusalAudit()

    # ---- application wiring -------------------------------------------------------------------------

    def make_app(self) -> web.Application:
        # Handlers of these routes parse the body as JSON whatever its Content-Type (the artifact routes
        # of app/artifacts/gateway_routes.py among them).
        json_routes = [
            protocol.ENROLL_PATH,
            protocol.REPORTS_PATH,
            "/api/artifacts",
            "/api/artifacts/{artifact_id}/fail",
        ]
        app = gateway_app(
            json_routes, client_max_size=16 * 1024 * 1024, middlewares=[_database_away_middleware]
        )
        app.router.add_post(protocol.ENROLL_PATH, self.enroll)
        app.router.add_get(protocol.CONTROL_PATH, self.control)
        app.router.add_post(protocol.REPORTS_PATH, self.http_report)
        app.router.add_get(protocol.FILES_PATH + "{kind}/{name:.+}", self.fetch_file)
        app.router.add_get(protocol.HEALTH_PATH, self.health)
        app.router.add_get(protocol.STATS_PATH, self.stats_answer)
        launch.install(app, self.db, self.blob_dir)
        app.on_startup.append(self._on_startup)
        app.on_shutdown.append(self._on_shutdown)
        app.on_cleanup.append(self._on_cleanup)
        return app

    async def _on_startup(self, _app: web.Application) -> None:
        await self.db.open()
        if self.liveness_db is not self.db:
            await self.liveness_db.open()
        await self._refresh_settings()
        for loop_fn in (
            self._listen_loop,
            self._poll_loop,
            self._flush_loop,
            self._settings_loop,
            self._lag_loop,
            self._gc_loop,
        ):
            self.tasks.append(asyncio.create_task(loop_fn(), name=loop_fn.__name__))

    async def _on_shutdown(self, _app: web.Application) -> None:
        for session in list(self.sessions.values()):
            session.close_reason = "gateway shutting down"
            with contextlib.suppress(Exception):
                await session.ws.close(code=1001, message=b"gateway shutting down")

    async def _on_cleanup(self, _app: web.Application) -> None:
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        with contextlib.suppress(Exception):
            await self._flush_heartbeats()
        await self.db.close()
        if self.liveness_db is not self.db:
            await self.liveness_db.close()

    # ---- HTTP endpoints -----------------------------------------------------------------------------

    async def health(self, _request: web.Request) -> web.Response:
        """Unauthenticated liveness: that it is alive, nothing else (no version, host name or counters
        for anyone probing)."""
        return web.json_response({"status": "ok"})

    async def stats_answer(self, request: web.Request) -> web.Response:
        """The gateway's counters, to a peer on the gateway's own host only (404 to anyone else)."""
        try:
            local = request.remote is not None and ipaddress.ip_address(request.remote).is_loopback
        except ValueError:
            local = False
        if not local:
            raise web.HTTPNotFound()
        answer = {
            "status": "ok",
            "gateway": self.name,
            "version": __version__,
            "sessions": len(self.sessions),
            **self.stats,
        }
        if request.query.get("reset") == "1":  # start a new measuring window for the *_max_ms figures
            for key in self.stats:
                if key.endswith("_max_ms"):
                    self.stats[key] = 0.0
        return web.json_response(answer)

    async def enroll(self, request: web.Request) -> web.Response:
        try:
            body = protocol.EnrollRequest.model_validate(await request_json(request))
        except ValidationError as exc:
            return _json_error(_malformed("enrollment request", exc))
        credential, credential_hash = new_token(protocol.CREDENTIAL_PREFIX)
        secret_hash = token_hash(body.token)
        try:
            row = await self.db.call_one(
                fn.enroll_node, secret_hash, body.name, credential_hash, request.remote
            )
        except Refusal as refusal:
            await self._record_refusal("enroll", secret_hash, refusal, request.remote, {"name": body.name})
            return _json_error(refusal)
        log.info("enrolled node %s in fleet %s", row["node"], row["fleet"])
        answer = protocol.EnrollResponse(
            node_id=row["node_id"], node=row["node"], fleet=row["fleet"], credential=credential
        )
        return web.json_response(answer.model_dump())

    async def _authenticate(self, request: web.Request) -> dict:
        credential = _bearer(request)
        if credential is None:
            raise Refusal("missing node credential (Authorization: Bearer …)", status=401, field="credential")
        secret_hash = token_hash(credential)
        try:
            return await self.db.call_one(fn.authenticate_node_credential, secret_hash)
        except Refusal as refusal:
            await self._record_refusal("authenticate", secret_hash, refusal, request.remote, {})
            raise

    async def _record_refusal(
        self, action: str, secret_hash: str, refusal: Refusal, address: str | None, details: dict
    ) -> None:
        # At most a few rows per source and minute (refusal_audit.py): a caller without a credential cannot
        # grow the events table without bound. Its own transaction: the refusing function's writes rolled
        # back with its error.
        suppressed = self.refusal_audit.admit(action, address)
        if suppressed is None:
            return
        if suppressed:
            details = {**details, "suppressed": suppressed}
        try:
            await self.db.call(
                fn.record_node_refusal, action, secret_hash, refusal.message, address, jsonb(details)
            )
        except Exception:
            log.exception("could not record a %s refusal", action)

    async def http_report(self, request: web.Request) -> web.Response:
        try:
            node = await self._authenticate(request)
            try:
                body = protocol.HttpReport.model_validate(await request_json(request))
            except ValidationError as exc:
                raise _malformed("report", exc) from None
            result = await dispatch_report(self.db, node["node_id"], body.epoch, body.kind, body.payload)
        except Refusal as refusal:
            return _json_error(refusal)
        except DB_TROUBLE as exc:
            log.warning("HTTP report met a database error: %s", describe_db_error(exc))
            return _database_away(
                f"database error ({describe_db_error(exc)}); send the report again", retryable=True
            )
        return web.json_response({"ok": True, "result": result})

    async def fetch_file(self, request: web.Request) -> web.StreamResponse:
        try:
            node = await self._authenticate(request)
        except Refusal as refusal:
            return _json_error(refusal)
        provider = files.FILE_PROVIDERS.get(request.match_info["kind"])
        if provider is None:
            return _json_error(Refusal(f"no file provider for {request.match_info['kind']!r}", status=404))
        return await provider(request, node, request.match_info["name"])

    # ---- the control session ------------------------------------------------------------------------

    async def _refuse_socket(self, request: web.Request, refusal: Refusal) -> web.StreamResponse:
        ws = web.WebSocketResponse()
        if not ws.can_prepare(request).ok:
            return _json_error(refusal)
        await ws.prepare(request)
        # A 503 (retryable) says when to come back, as its HTTP twin's Retry-After would.
        retry = {"retry_after_s": reconnect.RETRY_AFTER_S} if refusal.status == 503 else {}
        await ws.send_json({"type": "error", "status": refusal.status, "message": refusal.message, **retry})
        await ws.close(
            code=protocol.CLOSE_REFUSED_BASE + refusal.status, message=refusal.message[:120].encode()
        )
        return ws

    async def control(self, request: web.Request) -> web.StreamResponse:
        try:
            ident = await self._authenticate(request)
        except Refusal as refusal:
            return await self._refuse_socket(request, refusal)
        ws = web.WebSocketResponse(max_msg_size=4 * 1024 * 1024)
        if not ws.can_prepare(request).ok:
            return _json_error(Refusal("this endpoint speaks WebSocket only", status=400, field="Upgrade"))
        await ws.prepare(request)
        node_id = ident["node_id"]
        try:
            opened = await self.db.call_one(fn.node_session_opened, node_id, request.remote, self.name)
        except DB_TROUBLE as exc:
            # The database went away between the handshake's authentication and here: no session was
            # opened; the agent is told to come back after Retry-After (it does not give up on a 503).
            log.warning("node %s: no session, database away (%s)", ident["node"], describe_db_error(exc))
            await ws.send_json(
                {
                    "type": "error",
                    "status": 503,
                    "message": DATABASE_AWAY,
                    "retry_after_s": reconnect.RETRY_AFTER_S,
                }
            )
            await ws.close(code=protocol.CLOSE_REFUSED_BASE + 503, message=b"database unavailable")
            return ws
        rotate_due = ident["rotate_due_at"].timestamp()
        session = NodeSession(
            node_id=node_id,
            node=ident["node"],
            fleet=ident["fleet"],
            epoch=opened["epoch"],
            credential_id=ident["credential_id"],
            rotate_due=rotate_due,
            heartbeat_interval=float(opened["heartbeat_interval_s"]),
            ws=ws,
        )
        previous = self.sessions.get(node_id)
        self.sessions[node_id] = session
        if previous is not None:
            previous.close_reason = "replaced by a newer session of the same node"
            with contextlib.suppress(Exception):
                await previous.ws.close(code=4409, message=b"replaced by a newer session")
        reason = "agent closed the connection"
        try:
            await session.send(
                {
                    "type": "hello",
                    "node_id": node_id,
                    "node": session.node,
                    "fleet": session.fleet,
                    "epoch": session.epoch,
                    "heartbeat_interval_s": session.heartbeat_interval,
                    "gateway": self.name,
                    "gateway_version": __version__,
                }
            )
            self.wake(node_id)
            await self._maybe_rotate(session)
            silence = max(3 * session.heartbeat_interval, 5.0)
            while True:
                try:
                    message = await ws.receive(timeout=silence)
                except TimeoutError:
                    reason = f"no message from the agent for {silence:.0f}s"
                    break
                if message.type == WSMsgType.TEXT:
                    await self._on_message(session, message.data)
                elif message.type in (WSMsgType.CLOSE, WSMsgType.CLOSING, WSMsgType.CLOSED):
                    break
                elif message.type == WSMsgType.ERROR:
                    reason = f"socket error: {ws.exception()}"
                    break
        except (ConnectionError, RuntimeError) as exc:
            reason = f"connection error: {exc}"
        finally:
            if self.sessions.get(node_id) is session:
                del self.sessions[node_id]
            with contextlib.suppress(Exception):
                await ws.close()
            try:
                await self.db.call(
                    fn.node_session_closed, node_id, session.epoch, session.close_reason or reason
                )
            except Exception:
                log.exception("could not record the end of session %s of node %s", session.epoch, node_id)
        return ws

    async def _on_message(self, session: NodeSession, raw: str) -> None:
        try:
            message = protocol.AgentMessage.validate_python(load_json(raw, "message"))
        except Refusal as refusal:
            await session.send({"type": "error", "status": refusal.status, "message": refusal.message})
            return
        except ValidationError as exc:
            refusal = _malformed("message", exc)
            await session.send({"type": "error", "status": 400, "message": refusal.message})
            return
        if isinstance(message, protocol.Heartbeat):
            beat: dict[str, Any] = {"node_id": session.node_id, "epoch": session.epoch}
            if message.running != session.last_running:
                beat["running"] = message.running
                session.last_running = message.running
            previous = self.pending_heartbeats.get(session.node_id)
            if previous is not None and "running" in previous and "running" not in beat:
                beat["running"] = previous["running"]
            self.pending_heartbeats[session.node_id] = beat
            await self._maybe_rotate(session)
        elif isinstance(message, protocol.Ack):
            try:
                # Idempotent, and the agent sends an ack once: a deadlock victim is run again here.
                await self.db.call_retrying(
                    fn.ack_node_command,
                    session.node_id,
                    session.epoch,
                    message.id,
                    jsonb(message.result) if message.result is not None else None,
                    message.error,
                )
            except Refusal as refusal:
                log.warning("ack from node %s refused: %s", session.node, refusal.message)
            except DB_TROUBLE as exc:
                # The command stays unacknowledged and is delivered again to the node's next session.
                log.warning(
                    "ack %s from node %s not recorded: %s", message.id, session.node, describe_db_error(exc)
                )
        elif isinstance(message, protocol.Report):
            try:
                result = await dispatch_report(
                    self.db, session.node_id, session.epoch, message.kind, message.payload
                )
                await session.send(
                    {"type": "report_result", "ref": message.ref, "ok": True, "result": result}
                )
            except Refusal as refusal:
                await session.send(
                    {
                        "type": "report_result",
                        "ref": message.ref,
                        "ok": False,
                        "status": refusal.status,
                        "error": refusal.message,
                        "retryable": refusal.status == 503,
                    }
                )
            except DB_TROUBLE as exc:
                # A deadlock victim, a serialization failure, a lost or exhausted database connection: not the
                # node's fault and not final. The session stays; the agent sends the report again (every
                # report function is idempotent).
                log.warning(
                    "report %s from node %s met a database error: %s",
                    message.kind,
                    session.node,
                    describe_db_error(exc),
                )
                await session.send(
                    {
                        "type": "report_result",
                        "ref": message.ref,
                        "ok": False,
                        "status": 503,
                        "retryable": True,
                        "error": f"the {message.kind} report met a database error "
                        f"({describe_db_error(exc)}); it may not have been recorded: send it again",
                    }
                )
        elif (
            isinstance(message, protocol.CredentialSaved)
            and message.credential_id == session.rotation_pending
        ):
            try:
                await self.db.call_retrying(
                    fn.confirm_node_credential, session.node_id, message.credential_id
                )
            except (Refusal, *DB_TROUBLE) as exc:
                # The agent holds the new credential either way; authenticating with it next time confirms
                # it (authenticate_node_credential supersedes the older ones).
                why = exc.message if isinstance(exc, Refusal) else describe_db_error(exc)
                log.warning(
                    "node %s: confirming credential %s failed: %s", session.node, message.credential_id, why
                )
                return
            session.credential_id = message.credential_id
            session.rotation_pending = None
            session.rotate_due = time.time() + self.settings["credential_rotate_after"]
            log.info("node %s saved its rotated credential %s", session.node, message.credential_id)

    async def _maybe_rotate(self, session: NodeSession) -> None:
        """Issue a new credential over the socket when the current one is due (plaintext never stored)."""
        if session.rotation_pending is not None or time.time() < session.rotate_due:
            return
        credential, credential_hash = new_token(protocol.CREDENTIAL_PREFIX)
        try:
            new_id = (
                await self.db.call_one(
                    fn.rotate_node_credential, session.node_id, session.credential_id, credential_hash
                )
            )["rotate_node_credential"]
        except DB_TROUBLE as exc:
            log.warning("rotation for node %s not started: %s", session.node, describe_db_error(exc))
            session.rotate_due = time.time() + self.settings["heartbeat_interval"]
            return
        except Refusal as refusal:
            # Only the node's newest confirmed credential may rotate: a session opened with an older one
            # (in its grace period) never gets a new credential; it simply stops being usable.
            log.warning("rotation for node %s refused: %s", session.node, refusal.message)
            session.rotate_due = float("inf")
            return
        session.rotation_pending = new_id
        await session.send({"type": "rotate_credential", "credential_id": new_id, "credential": credential})

    # ---- command delivery ---------------------------------------------------------------------------

    def wake(self, node_id: int) -> None:
        """Claim node_id's new commands soon: every node woken before the claim task next runs (the
        NOTIFYs of one commit arrive together) is claimed for in one call."""
        if node_id not in self.sessions:
            return
        self.to_claim.add(node_id)
        if not self.claiming:
            self.claiming = True
            asyncio.get_running_loop().create_task(self._claim(), name="claim-commands")

    async def _claim(self) -> None:
        try:
            while self.to_claim:
                woken, self.to_claim = sorted(self.to_claim), set()
                sessions = [s for i in woken if (s := self.sessions.get(i)) is not None and not s.ws.closed]
                for first in range(0, len(sessions), CLAIM_SESSIONS_AT_ONCE):
                    try:
                        await self._claim_for(sessions[first : first + CLAIM_SESSIONS_AT_ONCE])
                    except Exception:  # a bug: said, and the poll loop finds these commands again
                        log.exception("claiming commands for %d node(s) failed", len(sessions))
        finally:
            self.claiming = False

    async def _claim_for(self, sessions: list[NodeSession]) -> None:
        try:
            rows = await self.db.call(
                fn.claim_sessions_commands,
                [s.node_id for s in sessions],
                [s.epoch for s in sessions],
                CLAIM_PER_NODE,
            )
        except (Refusal, *DB_TROUBLE) as exc:
            # Nothing was claimed (one transaction): the poll loop finds these commands again.
            why = exc.message if isinstance(exc, Refusal) else describe_db_error(exc)
            log.warning("claiming commands for %d node(s) failed: %s", len(sessions), why)
            return
        by_node: dict[int, list[dict]] = {}
        for row in rows:
            by_node.setdefault(row["node_id"], []).append(row)
        for session in sessions:
            claimed = by_node.get(session.node_id)
            if not claimed:
                continue
            if len(claimed) >= CLAIM_PER_NODE:  # more may be waiting: claim again
                self.to_claim.add(session.node_id)
            # Sent to the session they were claimed for (its epoch), even if a newer one replaced it since:
            # a closed socket fails the send, and the newer session is delivered them after it reconciles.
            session.outbox.extend(claimed)
            if not session.sending:
                session.sending = True
                asyncio.get_running_loop().create_task(self._send_outbox(session))

    async def _send_outbox(self, session: NodeSession) -> None:
        try:
            while session.outbox and not session.ws.closed:
                row = session.outbox.popleft()
                await session.send(
                    {"type": "command", "id": row["id"], "kind": row["kind"], "payload": row["payload"]}
                )
                self.stats["commands_delivered"] += 1
        except (ConnectionError, RuntimeError) as exc:
            log.info("delivery to node %s interrupted: %s", session.node, exc)
        except Exception:
            log.exception("delivery to node %s failed", session.node)
        finally:
            session.outbox.clear()  # claimed by this session only: delivered again to the node's next one
            session.sending = False

    # ---- background loops ---------------------------------------------------------------------------

    async def _listen_loop(self) -> None:
        def on_notify(notify: psycopg.Notify) -> None:
            with contextlib.suppress(ValueError):
                self.wake(int(notify.payload))

        def on_listening() -> None:
            # Anything written while we were not listening is found now, not at the next poll.
            for node_id in list(self.sessions):
                self.wake(node_id)

        await reconnect.listen_forever(
            self.db.listen_connection, (COMMANDS_CHANNEL,), on_notify, on_listening, name="node gateway"
        )

    async def _poll_loop(self) -> None:
        while True:
            await asyncio.sleep(self.poll_interval)
            ids = list(self.sessions)
            try:
                for start in range(0, len(ids), 5000):
                    rows = await self.db.call(fn.nodes_with_pending_commands, ids[start : start + 5000])
                    for row in rows:
                        self.wake(row["node_id"])
            except (psycopg.Error, OSError) as exc:
                log.warning("outbox poll failed: %s", exc)

    def flush_interval(self) -> float:
        return max(0.1, min(1.0, self.settings["heartbeat_interval"] / 4))

    async def _flush_heartbeats(self) -> None:
        if not self.pending_heartbeats:
            return
        batch, self.pending_heartbeats = list(self.pending_heartbeats.values()), {}
        await self.liveness_db.call(fn.node_heartbeats, jsonb(batch))
        self.stats["heartbeats_written"] += len(batch)
        self.stats["heartbeat_flushes"] += 1

    async def _flush_loop(self) -> None:
        while True:
            await asyncio.sleep(self.flush_interval())
            started = time.monotonic()
            try:
                await self._flush_heartbeats()
                took = (time.monotonic() - started) * 1000
                self.stats["flush_max_ms"] = max(self.stats["flush_max_ms"], round(took, 1))
            except (psycopg.Error, OSError) as exc:
                log.warning("heartbeat flush failed: %s", exc)

    def _gc_timer(self, phase: str, info: dict) -> None:
        if info.get("generation") != 2:
            return
        if phase == "start":
            self._gc_started = time.perf_counter()
        else:
            took = (time.perf_counter() - self._gc_started) * 1000
            self.stats["gc_full_max_ms"] = max(self.stats["gc_full_max_ms"], round(took, 1))

    async def _gc_loop(self) -> None:
        """Keep full garbage collections short while thousands of sessions live here.

        A full collection walks every tracked object; with 10,000 sessions that took 1.4-1.9 s here
        (bench/gateway_agents.py), stalling every session at once. When the session count has moved (or a
        minute has passed with many sessions), young garbage is collected and everything alive is frozen
        (gc.freeze): later full collections only walk what was allocated since. Cycles among frozen
        objects that die later (closed sessions) are reclaimed by an hourly unfreeze, which costs one long
        collection an hour instead of many.
        """
        loop = asyncio.get_running_loop()
        frozen_sessions = 0
        last_unfreeze = last_freeze = loop.time()
        while True:
            await asyncio.sleep(10)
            if loop.time() - last_unfreeze > 3600:
                gc.unfreeze()
                last_unfreeze, frozen_sessions = loop.time(), 0
                continue
            sessions = len(self.sessions)
            moved = abs(sessions - frozen_sessions) >= max(50, frozen_sessions // 20)
            if moved or (sessions >= 1000 and loop.time() - last_freeze > 60):
                gc.collect(1)
                gc.freeze()
                frozen_sessions, last_freeze = sessions, loop.time()

    async def _lag_loop(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            before = loop.time()
            await asyncio.sleep(0.1)
            lag = (loop.time() - before - 0.1) * 1000
            self.stats["loop_lag_max_ms"] = max(self.stats["loop_lag_max_ms"], round(lag, 1))

    async def _refresh_settings(self) -> None:
        row = (
            await self.db.fetch_all(
                "SELECT extract(epoch FROM heartbeat_interval)::float8 AS heartbeat_interval,"
                " extract(epoch FROM stale_after)::float8 AS stale_after,"
                " extract(epoch FROM credential_rotate_after)::float8 AS credential_rotate_after"
                " FROM node_settings"
            )
        )[0]
        self.settings.update(row)

    async def _settings_loop(self) -> None:
        while True:
            await asyncio.sleep(10)
            with contextlib.suppress(psycopg.Error, OSError):
                await self._refresh_settings()


def server_ssl_context(cert: str | None, key: str | None) -> ssl.SSLContext | None:
    if not cert:
        return None
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)
    return context


async def serve(
    database_url: str,
    host: str,
    port: int,
    *,
    name: str,
    tls_cert: str | None = None,
    tls_key: str | None = None,
    poll_interval: float = 2.0,
    pool_size: int = 8,
    stop: asyncio.Event | None = None,
    blob_dir: Path | None = None,
) -> None:
    import signal

    db = AsyncDatabase(database_url, max_size=pool_size, name="tuneplane-node-gateway")
    liveness = AsyncDatabase(database_url, min_size=1, max_size=2, name="tuneplane-node-gateway-liveness")
    gateway = Gateway(db, liveness_db=liveness, name=name, poll_interval=poll_interval, blob_dir=blob_dir)
    runner = web.AppRunner(gateway.make_app(), access_log=None, shutdown_timeout=5)
    await runner.setup()
    context = server_ssl_context(tls_cert, tls_key)
    site = web.TCPSite(runner, host, port, ssl_context=context, backlog=4096)
    await site.start()
    scheme = "https" if context else "http"
    print(
        f"node gateway listening on {scheme}://{host}:{port} "
        f"(started {dt.datetime.now(dt.UTC).isoformat(timespec='seconds')})",
        flush=True,
    )
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await runner.cleanup()
