"""One control session: enroll if needed, connect the WebSocket, heartbeat, run commands, rotate.

The session ends when the connection ends; the caller (workers.agent.main) reconnects with backoff.
A refusal by the gateway (credential or enrollment token refused) raises Refused and is not retried.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import aiohttp

from tuneplane.app.client.transport import retry_after
from tuneplane.app.node_gateway import protocol
from tuneplane.workers.agent.credential import CredentialStore, StoredCredential
from tuneplane.workers.agent.handlers import COMMAND_HANDLERS, SESSION_HOOKS, AgentContext, CommandFailed

log = logging.getLogger("tuneplane.agent")


class Refused(Exception):
    """The gateway refused this node (HTTP status in .status); retrying the same secret will not help."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.message = message
        self.status = status


class Unavailable(ConnectionError):
    """The gateway is up but its database is away (a restart, a failover): it answered 503 and when to come
    back (`retry_after`, seconds, from Retry-After). Never final: the agent tries again after that pause."""

    def __init__(self, message: str, retry_after: float | None) -> None:
        super().__init__(message)
        self.message = message
        self.retry_after = retry_after


class ReportNotRecorded(ConnectionError):
    """The gateway met a database error it could not get past (answered `retryable`): the report may not
    have been recorded and should be sent again later; the session itself is fine. A ConnectionError, so
    callers that keep unsent reports for the next session keep this one too."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.message = message
        self.status = status


# Pauses (seconds) before sending a report again after a `retryable` answer (a deadlock victim, a database
# restart); after the last one the report raises ReportNotRecorded.
REPORT_RETRY_PAUSES = (0.1, 0.3, 1.0, 2.0)


def endpoint(server: str, path: str, websocket: bool = False) -> str:
    url = server.rstrip("/") + path
    if websocket:
        url = "ws" + url[len("http") :]  # http -> ws, https -> wss
    return url


async def enroll(
    http: aiohttp.ClientSession, server: str, token: str, name: str, hostname: str | None = None
) -> StoredCredential:
    body = protocol.EnrollRequest(token=token, name=name, hostname=hostname).model_dump()
    async with http.post(
        endpoint(server, protocol.ENROLL_PATH), json=body, timeout=aiohttp.ClientTimeout(total=30)
    ) as response:
        try:
            data = await response.json(content_type=None)
        except ValueError:
            data = None
        if response.status >= 400:
            message = data.get("error") if isinstance(data, dict) else f"HTTP {response.status}"
            if 400 <= response.status < 500:
                raise Refused(f"enrollment refused: {message}", response.status)
            raise aiohttp.ClientResponseError(
                response.request_info, (), status=response.status, message=str(message),
                headers=response.headers,
            )  # fmt: skip
    answer = protocol.EnrollResponse.model_validate(data)
    return StoredCredential(
        node_id=answer.node_id, node=answer.node, fleet=answer.fleet, credential=answer.credential
    )


class ControlSession:
    def __init__(
        self,
        http: aiohttp.ClientSession,
        server: str,
        store: CredentialStore,
        ctx: AgentContext,
        capacity: Callable[[], dict],
        *,
        say: Callable[[str], None] = print,
        ping_interval: float | None = None,
    ) -> None:
        self.http = http
        self.server = server
        self.store = store
        self.ctx = ctx
        self.capacity = capacity
        self.say = say
        self.ping_interval = ping_interval
        self.ws: aiohttp.ClientWebSocketResponse | None = None
        self.epoch: int | None = None
        self.connected = asyncio.Event()
        self._refs = 0
        self._waiting: dict[int, asyncio.Future] = {}
        self._commands: asyncio.Queue = asyncio.Queue()
        # Results of commands handled by this process: a redelivery is acknowledged, not run again.
        self._done: OrderedDict[int, tuple[dict | None, str | None]] = OrderedDict()

    async def send(self, message: dict) -> None:
        assert self.ws is not None
        await self.ws.send_str(json.dumps(message))

    async def report(self, kind: str, payload: dict, timeout: float = 30.0) -> Any:
        """Send a report and wait for its result; a `retryable` answer is sent again after
        REPORT_RETRY_PAUSES (every report kind is idempotent). Raises Refused, ReportNotRecorded,
        ConnectionError or TimeoutError."""
        for pause in (*REPORT_RETRY_PAUSES, None):
            try:
                return await self._report_once(kind, payload, timeout)
            except ReportNotRecorded as exc:
                if pause is None:
                    raise
                log.info("%s report not recorded (%s); sending it again in %.1fs", kind, exc.message, pause)
                await asyncio.sleep(pause)
        raise AssertionError("unreachable")

    async def _report_once(self, kind: str, payload: dict, timeout: float) -> Any:
        self._refs += 1
        ref = self._refs
        future = asyncio.get_running_loop().create_future()
        self._waiting[ref] = future
        try:
            await self.send({"type": "report", "ref": ref, "kind": kind, "payload": payload})
            return await asyncio.wait_for(future, timeout)
        finally:
            self._waiting.pop(ref, None)

    async def run(self) -> str:
        """Connect and serve until the connection ends; returns why it ended."""
        stored = self.store.load()
        if stored is None:
            raise Refused("no node credential in the state directory: enroll with --enroll-token", 401)
        interval_guess = self.ping_interval or 10.0
        self.ws = await self.http.ws_connect(
            endpoint(self.server, protocol.CONTROL_PATH, websocket=True),
            headers={"Authorization": f"Bearer {stored.credential}"},
            heartbeat=interval_guess * 2,
            max_msg_size=16 * 1024 * 1024,
            timeout=aiohttp.ClientWSTimeout(ws_close=5.0),
        )
        tasks: list[asyncio.Task] = []
        try:
            first = await self.ws.receive(timeout=30)
            hello = self._first_message(first)
            self.epoch = hello["epoch"]
            self.ctx.node_id, self.ctx.node, self.ctx.fleet = hello["node_id"], hello["node"], hello["fleet"]
            self.ctx.report = self.report
            interval = float(hello["heartbeat_interval_s"])
            self.say(
                f"connected to {self.server} as node {hello['fleet']}/{hello['node']} "
                f"(id {hello['node_id']}, session {self.epoch})"
            )
            tasks.append(asyncio.create_task(self._heartbeats(interval)))
            tasks.append(asyncio.create_task(self._run_commands()))
            tasks.append(asyncio.create_task(self._report_capacity()))
            for hook in SESSION_HOOKS:
                task = asyncio.create_task(hook(self.ctx))
                task.add_done_callback(self._hook_done)
                tasks.append(task)
            self.connected.set()
            return await self._receive_loop()
        finally:
            self.connected.clear()
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            for future in self._waiting.values():
                if not future.done():
                    future.set_exception(ConnectionError("control connection closed"))
            if not self.ws.closed:
                await self.ws.close()

    def _hook_done(self, task: asyncio.Task) -> None:
        """A session hook that failed (e.g. reconcile not accepted) ends the session: the control plane
        delivers no command to a session that has not reconciled, so a new session must try again."""
        if task.cancelled() or task.exception() is None or self.ws is None or self.ws.closed:
            return
        self.say(f"session set-up failed ({task.exception()}); reconnecting")
        asyncio.get_running_loop().create_task(self.ws.close())

    def _first_message(self, message: aiohttp.WSMessage) -> dict:
        if message.type == aiohttp.WSMsgType.TEXT:
            data = json.loads(message.data)
            if data.get("type") == "hello":
                return data
            if data.get("type") == "error":
                status = int(data.get("status", 401))
                if status == 503:
                    asked = retry_after(503, str(data.get("retry_after_s", "")))
                    raise Unavailable(data.get("message", "the gateway's database is away"), asked)
                raise Refused(data.get("message", "refused"), status)
        code = self.ws.close_code if self.ws is not None else None
        if code == protocol.CLOSE_REFUSED_BASE + 503:
            raise Unavailable("the gateway's database is away", None)
        if code is not None and code >= protocol.CLOSE_REFUSED_BASE and code != 4409:
            raise Refused(
                f"gateway closed the connection with code {code}", code - protocol.CLOSE_REFUSED_BASE
            )
        raise ConnectionError(f"gateway sent no hello (got {message.type.name})")

    async def _receive_loop(self) -> str:
        assert self.ws is not None
        async for message in self.ws:
            if message.type != aiohttp.WSMsgType.TEXT:
                continue
            data = json.loads(message.data)
            kind = data.get("type")
            if kind == "command":
                self._commands.put_nowait(data)
            elif kind == "report_result":
                future = self._waiting.get(data.get("ref"))
                if future is not None and not future.done():
                    if data.get("ok"):
                        future.set_result(data.get("result"))
                    elif data.get("retryable"):
                        future.set_exception(
                            ReportNotRecorded(data.get("error", "not recorded"), data.get("status", 503))
                        )
                    else:
                        future.set_exception(
                            Refused(data.get("error", "report refused"), data.get("status", 400))
                        )
            elif kind == "rotate_credential":
                await self._rotate(data)
            elif kind == "error":
                if data.get("status") in (401, 403):
                    raise Refused(data.get("message", "refused"), data["status"])
                log.warning("gateway error: %s", data.get("message"))
        code = self.ws.close_code
        if code is not None and code >= protocol.CLOSE_REFUSED_BASE and code not in (4409,):
            raise Refused(f"gateway closed the session with code {code}", code - protocol.CLOSE_REFUSED_BASE)
        return f"connection closed (code {code})"

    async def _rotate(self, data: dict) -> None:
        current = self.store.load()
        assert current is not None
        rotated = StoredCredential(
            node_id=current.node_id,
            node=current.node,
            fleet=current.fleet,
            credential=data["credential"],
            credential_id=data["credential_id"],
        )
        # Saved (fsync'd) before we say so: the gateway starts the old credential's grace period on our word.
        await asyncio.to_thread(self.store.save, rotated)
        await self.send({"type": "credential_saved", "credential_id": data["credential_id"]})
        self.say(f"credential rotated (credential {data['credential_id']})")

    async def _heartbeats(self, interval: float) -> None:
        while True:
            await self.send({"type": "heartbeat", "running": self.ctx.running})
            await asyncio.sleep(interval)

    async def _report_capacity(self) -> None:
        try:
            capacity = await asyncio.to_thread(self.capacity)
            problem = capacity.pop("_problem", None)
            await self.report("capacity", capacity)
            if problem:
                await self.report("note", {"message": problem, "source": "capacity"})
        except (TimeoutError, Refused, ConnectionError) as exc:
            log.warning("capacity report failed: %s", exc)

    async def _run_commands(self) -> None:
        while True:
            command = await self._commands.get()
            command_id = command["id"]
            if command_id in self._done:
                result, error = self._done[command_id]
            else:
                result, error = await self._handle(command)
                self._done[command_id] = (result, error)
                while len(self._done) > 10_000:
                    self._done.popitem(last=False)
            with contextlib.suppress(ConnectionError, RuntimeError):
                await self.send({"type": "ack", "id": command_id, "result": result, "error": error})

    async def _handle(self, command: dict) -> tuple[dict | None, str | None]:
        handler = COMMAND_HANDLERS.get(command["kind"])
        if handler is None:
            return None, f"this agent has no handler for command kind {command['kind']!r}"
        try:
            return await handler(self.ctx, command.get("payload") or {}), None
        except CommandFailed as exc:
            return None, str(exc)
        except Exception as exc:  # a handler bug must not kill the session; the error is recorded
            log.exception("command %s (%s) failed", command["id"], command["kind"])
            return None, f"{type(exc).__name__}: {exc}"
