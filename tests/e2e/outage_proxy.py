"""A loopback HTTP + WebSocket proxy in front of the node gateway that can answer 503 for a while.

A fault injector for the e2e tests (named so: it is not part of TunePlane): agents dial the proxy, which
passes every request and the control WebSocket through to the real gateway, except requests matching an
outage (method + path) while it lasts, which get `503 Service Unavailable` as an overloaded server sends,
and commands of a swallowed kind, which never reach the agent (as if the gateway died after taking them
from the outbox and before sending them).
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from dataclasses import dataclass, field

import aiohttp
from aiohttp import web

from tests.conftest import free_port

HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "upgrade", "host", "content-length"}


@dataclass
class Outage:
    method: str
    path: str
    until: float
    refused: list[float] = field(default_factory=list)

    def matches(self, path: str) -> bool:
        """The path itself, or any path under it when it ends with `*`."""
        if self.path.endswith("*"):
            return path.startswith(self.path[:-1])
        return path == self.path


class OutageProxy:
    def __init__(self, upstream: str) -> None:
        self.upstream = upstream.rstrip("/")
        self.port = free_port()
        self.outages: list[Outage] = []
        # Command kinds dropped on their way to the agent, and the commands dropped so far.
        self.swallowed_kinds: set[str] = set()
        self.swallowed: list[dict] = []
        self.loop = asyncio.new_event_loop()
        self.ready = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> OutageProxy:
        self.thread.start()
        assert self.ready.wait(20), "the outage proxy did not start"
        return self

    def refuse(self, method: str, path: str, seconds: float) -> Outage:
        outage = Outage(method, path, time.monotonic() + seconds)
        self.outages.append(outage)
        return outage

    def swallow(self, *kinds: str) -> None:
        """From now on, drop every command of these kinds the gateway sends (none: deliver them all)."""
        self.swallowed_kinds = set(kinds)

    def _passes(self, text: str) -> bool:
        if not self.swallowed_kinds or '"command"' not in text:
            return True
        message = json.loads(text)
        if message.get("type") == "command" and message.get("kind") in self.swallowed_kinds:
            self.swallowed.append(message)
            return False
        return True

    def stop(self) -> None:
        async def close() -> None:
            await self.session.close()
            await self.runner.cleanup()

        asyncio.run_coroutine_threadsafe(close(), self.loop).result(20)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)

    def _serve(self) -> None:
        asyncio.set_event_loop(self.loop)
        app = web.Application(client_max_size=1024**3)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self.runner = runner = web.AppRunner(app)
        self.loop.run_until_complete(runner.setup())
        self.loop.run_until_complete(web.TCPSite(runner, "127.0.0.1", self.port).start())
        self.session = aiohttp.ClientSession(loop=self.loop)
        self.ready.set()
        self.loop.run_forever()

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        if request.headers.get("Upgrade", "").lower() == "websocket":
            return await self._websocket(request)
        now = time.monotonic()
        for outage in self.outages:
            if request.method == outage.method and outage.matches(request.path) and now < outage.until:
                outage.refused.append(now)
                return web.json_response({"error": "service unavailable (test outage)"}, status=503)
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP_BY_HOP}
        body = await request.read()
        async with self.session.request(
            request.method, self.upstream + request.path_qs, headers=headers, data=body
        ) as upstream:
            data = await upstream.read()
            kept = {k: v for k, v in upstream.headers.items() if k.lower() not in HOP_BY_HOP}
            return web.Response(status=upstream.status, body=data, headers=kept)

    async def _websocket(self, request: web.Request) -> web.StreamResponse:
        headers = {"Authorization": request.headers.get("Authorization", "")}
        try:
            client = await self.session.ws_connect(
                self.upstream + request.path_qs, headers=headers, max_msg_size=64 * 1024**2
            )
        except aiohttp.WSServerHandshakeError as exc:
            return web.Response(status=exc.status, text=exc.message)
        except aiohttp.ClientError:
            return web.Response(status=502, text="gateway unreachable")
        server = web.WebSocketResponse(max_msg_size=64 * 1024**2)
        await server.prepare(request)

        async def pump(source, sink) -> None:
            async for message in source:
                if message.type == aiohttp.WSMsgType.TEXT:
                    if sink is server and not self._passes(message.data):
                        continue
                    await sink.send_str(message.data)
                elif message.type == aiohttp.WSMsgType.BINARY:
                    await sink.send_bytes(message.data)
                else:
                    break

        tasks = [asyncio.ensure_future(pump(server, client)), asyncio.ensure_future(pump(client, server))]
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        for task in tasks:
            task.cancel()
        await client.close()
        await server.close()
        return server
