"""The input-limits layer of both aiohttp gateways (node control, telemetry): one middleware in front.

It applies app.input_limits to every request before its handler runs: query parameters and route
segments (NUL, lone surrogates, integer parameters within their SQL type, ids within bigint), and the
body of every route the gateway declares JSON (whatever its Content-Type says) parsed once by the
bounded parser (depth, NUL, surrogates, bigint range, no NaN) and kept in `request[JSON_KEY]` for
`request_json()`; other routes' bodies are left to their handlers (artifact chunks are raw bytes).
The telemetry gateway's `points` get the depth check only: it refuses a bad point alone
(app/telemetry), not the batch. Refusals answer the gateways' JSON error shape `{"error", "status",
"fields"}`; a value PostgreSQL still refuses (a data exception, class 22) is the client's 400, not a
500, and so is a body shorter than its Content-Length. The body size is aiohttp's client_max_size (413).
`gateway_app` builds either gateway's application with this layer in front and a `Server` header that
names no version (aiohttp would announce `Python/3.11 aiohttp/3.x` to anyone probing for known holes).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable
from typing import Any

import psycopg
from aiohttp import http_exceptions, web

from tuneplane.app import input_limits
from tuneplane.app.errors import Refusal, clip

# A typed request key where aiohttp has them (3.12+), a plain string before.
JSON_KEY: Any = web.RequestKey("tuneplane_json", object) if hasattr(web, "RequestKey") else "tuneplane_json"


class _ClientProtocolErrors(logging.Filter):
    """aiohttp answers a malformed request (a request line over 8 KiB, a bad header) with 400 itself,
    but logs it as an ERROR with a traceback; it is the client's fault: one warning line instead."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if isinstance(exc, http_exceptions.HttpProcessingError):
            record.msg = f"{record.getMessage()}: refused a malformed request ({clip(str(exc).strip(), 200)})"
            record.args = None
            record.exc_info = None
            record.exc_text = None
            record.levelno, record.levelname = logging.WARNING, "WARNING"
        return True


def quiet_client_protocol_errors() -> None:
    server_log = logging.getLogger("aiohttp.server")
    if not any(isinstance(f, _ClientProtocolErrors) for f in server_log.filters):
        server_log.addFilter(_ClientProtocolErrors())


def refusal_response(refusal: Refusal) -> web.Response:
    return web.json_response(refusal.as_json(), status=refusal.status)


def data_refusal(exc: psycopg.DataError, field: str = "payload") -> Refusal:
    """A PostgreSQL data exception as the client's 400 (its first line, clipped by Refusal)."""
    column = getattr(exc.diag, "column_name", None) or field
    return Refusal(f"a value is out of range or malformed: {str(exc).splitlines()[0]}", 400, column)


def input_limits_middleware(json_paths: Iterable[str] = (), *, depth_only: Iterable[str] = ()) -> Any:
    """The middleware for one gateway: `json_paths` (route patterns as added, `/x/{id}/y`) take JSON
    whatever the Content-Type says; under the top-level keys `depth_only` only the depth is checked."""
    always_json = frozenset(json_paths)
    depth_only_keys = frozenset(depth_only)
    quiet_client_protocol_errors()

    @web.middleware
    async def middleware(request: web.Request, handler: Any) -> web.StreamResponse:
        try:
            input_limits.check_query(request.query)
            for name, value in request.match_info.items():
                input_limits.check_route_value(name, value)
            resource = request.match_info.route.resource
            route = resource.canonical if resource is not None else request.path
            # Only routes that take JSON: the others (artifact chunks) read their raw body themselves.
            if request.body_exists and route in always_json:
                raw = await request.read()
                request[JSON_KEY] = input_limits.load_json(raw, depth_only=depth_only_keys)
            return await handler(request)
        except Refusal as refusal:
            return refusal_response(refusal)
        except psycopg.DataError as exc:
            return refusal_response(data_refusal(exc))
        except asyncio.IncompleteReadError:
            return refusal_response(Refusal("the body ended before its Content-Length", 400, "body"))

    return middleware


SERVER_HEADER = "TunePlane"


async def _server_without_version(_request: web.Request, response: web.StreamResponse) -> None:
    response.headers["Server"] = SERVER_HEADER  # set before aiohttp's own setdefault of its version


def gateway_app(
    json_paths: Iterable[str] = (),
    *,
    depth_only: Iterable[str] = (),
    client_max_size: int,
    middlewares: Iterable[Any] = (),
) -> web.Application:
    """A gateway's aiohttp application: the input-limits layer first, then `middlewares`."""
    limits = input_limits_middleware(json_paths, depth_only=depth_only)
    app = web.Application(client_max_size=client_max_size, middlewares=[limits, *middlewares])
    app.on_response_prepare.append(_server_without_version)
    return app


async def request_json(request: web.Request, field: str = "body") -> Any:
    """The request's JSON body within the limits (parsed once by the middleware when it was JSON)."""
    if JSON_KEY in request:
        return request[JSON_KEY]
    return input_limits.load_json(await request.read(), field)
