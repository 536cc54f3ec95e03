"""The telemetry gateway: its own aiohttp process that collectors and the SDK push batches to.

It talks to PostgreSQL only through the telemetry functions (scope check, ledger, series, rollups) plus a
binary COPY of the points; it never calls the control path. Refusals from those functions become 4xx JSON
answers with the reason; an unreachable database becomes 503 so that senders back off and retry.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator
from typing import Literal

import numpy as np
import psycopg
from aiohttp import web
from psycopg.rows import dict_row
from psycopg_pool import AsyncConnectionPool, PoolTimeout
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from tuneplane.app import pool_check, reconnect
from tuneplane.app.db import SEARCH_PATH_OPTION
from tuneplane.app.errors import Refusal, refusal_from_db
from tuneplane.app.gateway_limits import gateway_app, refusal_response, request_json
from tuneplane.app.security import token_hash
from tuneplane.app.telemetry import limits, wire
from tuneplane.app.telemetry.ingest import batch_digest, store_batch

log = logging.getLogger(__name__)

POOL_KEY = web.AppKey("pool", AsyncConnectionPool)


class SdkPoint(BaseModel):
    # Checked per point (app.telemetry.limits): a bad name, step or value refuses that point alone.
    # Strict types: `"step": "1"` or `"step": true` is a malformed batch, not a coerced point.
    model_config = ConfigDict(strict=True)
    name: str = Field(max_length=wire.MAX_HEADER_STRING)
    step: int
    value: float | int
    wall_time: float | None = None


class SdkBatch(BaseModel):
    # Unknown top-level fields are refused by name (a misspelt `point` is not an empty batch); the format
    # is versioned (`format`, only 1 so far) so the SDK can grow without the gateway guessing.
    model_config = ConfigDict(strict=True, extra="forbid")
    format: Literal[1] = 1
    client: str = Field(min_length=1, max_length=200)
    seq: int = Field(ge=0, lt=2**63)
    source: str = Field(default="sdk", min_length=1, max_length=limits.MAX_NAME_LEN)
    points: list[SdkPoint] = Field(max_length=100_000)


def _error(status: int, message: str, fields: dict | None = None) -> web.Response:
    # Through Refusal, which bounds every echo (app.errors.clip): a 1 MB field is quoted as 600 characters.
    response = refusal_response(Refusal(message, status, fields=dict(fields or {})))
    if status == 503:  # the database is away (a restart, a failover): collectors wait this long, then resend
        response.headers["Retry-After"] = str(reconnect.RETRY_AFTER_S)
    return response


def _bearer(request: web.Request) -> str:
    header = request.headers.get("Authorization", "")
    if not header.startswith("Bearer ") or not header[7:].strip():
        raise Refusal("a telemetry token is required (Authorization: Bearer …)", 401, "token")
    return token_hash(header[7:].strip())


@web.middleware
async def refusals(request: web.Request, handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except Refusal as exc:
        return _error(exc.status, exc.message, exc.fields)
    except wire.WireError as exc:
        return _error(400, str(exc), {exc.field: str(exc)})
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first.get("loc", ())) or "body"
        said = "unknown field" if first.get("type") == "extra_forbidden" else first.get("msg", "")
        return _error(400, f"{where}: {said}", {where: said})
    except (psycopg.OperationalError, PoolTimeout) as exc:
        log.warning("database unavailable: %s", str(exc).strip().splitlines()[0] if str(exc).strip() else exc)
        return _error(503, "the database is unavailable; retry later")
    except psycopg.Error as exc:
        refusal = refusal_from_db(exc)
        if refusal is not None:
            return _error(refusal.status, refusal.message, refusal.fields)
        if isinstance(exc, psycopg.DataError):  # content PostgreSQL cannot hold: final, not "retry later"
            return _error(422, f"the database cannot store this batch: {exc.diag.message_primary or exc}")
        log.exception("database error")
        return _error(503, "database error; retry later")
    except web.HTTPException:
        raise
    except Exception:
        log.exception("unexpected error")
        return _error(500, "internal error; the gateway log has the details")


async def _store(request: web.Request, batch: wire.Batch, digest: str) -> web.Response:
    token = _bearer(request)
    pool = request.app[POOL_KEY]
    started = time.perf_counter()
    async with pool.connection() as conn:
        result = await store_batch(conn, token, batch, digest)
    log.debug(
        "batch %s/%s: %d points in %.1f ms",
        batch.collector,
        batch.seq,
        batch.count,
        (time.perf_counter() - started) * 1000,
    )
    return web.json_response(result)


async def post_batch(request: web.Request) -> web.Response:
    _bearer(request)  # refuse a missing token before reading a large body
    started = time.perf_counter()
    payload = await request.read()
    batch = wire.decode(payload)
    log.debug("batch read and decoded in %.1f ms", (time.perf_counter() - started) * 1000)
    return await _store(request, batch, batch_digest(payload))


async def post_points(request: web.Request) -> web.Response:
    _bearer(request)
    raw = await request.read()
    sdk = SdkBatch.model_validate(await request_json(request))  # parsed once, within the limits
    order: dict[str, list[tuple[int, float, float]]] = {}
    refused: dict[tuple[str, str], int] = {}
    now = time.time()
    for point in sdk.points:
        why = None
        try:
            value = float(point.value)
        except OverflowError:
            why = limits.VALUE_TOO_LARGE
        if why is None and not limits.step_ok(point.step):
            why = limits.STEP_RANGE
        if why is not None:
            key = (point.name if limits.name_problem(point.name) is None else "", why)
            refused[key] = refused.get(key, 0) + 1
            continue
        wall = now if point.wall_time is None else point.wall_time
        order.setdefault(point.name, []).append((point.step, value, wall))
    ordered = [p for points in order.values() for p in points]
    batch = wire.Batch(
        collector=sdk.client,
        seq=sdk.seq,
        series=[(sdk.source, name, len(points)) for name, points in order.items()],
        steps=np.fromiter((p[0] for p in ordered), dtype=np.int64, count=len(ordered)),
        values=np.fromiter((p[1] for p in ordered), dtype=np.float64, count=len(ordered)),
        wall_times=np.fromiter((p[2] for p in ordered), dtype=np.float64, count=len(ordered)),
        refused=[(sdk.source, name, why, n) for (name, why), n in refused.items()],
    )
    return await _store(request, batch, batch_digest(raw))


async def get_scope(request: web.Request) -> web.Response:
    token = _bearer(request)
    async with request.app[POOL_KEY].connection() as conn:
        cur = await conn.execute("SELECT * FROM tuneplane.authenticate_telemetry_token(%s)", (token,))
        row = await cur.fetchone()
    return web.json_response(
        {
            "job_id": row["job_id"],
            "attempt": row["attempt"],
            "member": row["member_rank"],
            "expires_at": row["expires_at"].isoformat(),
        }
    )


async def healthz(request: web.Request) -> web.Response:
    try:
        async with request.app[POOL_KEY].connection(timeout=2) as conn:
            await conn.execute("SELECT 1")
    except Exception:
        return _error(503, "database unavailable")
    return web.json_response({"ok": True})


def create_app(database_url: str, *, pool_max: int = 8) -> web.Application:
    # The input-limits layer (app/gateway_limits.py) in front: query, route, JSON depth and the batch's
    # own fields; each point's values are judged here, point by point.
    app = gateway_app(
        ["/v1/telemetry/points"],
        depth_only=["points"],
        client_max_size=wire.MAX_BATCH_BYTES,
        middlewares=[refusals],
    )

    async def lifecycle(app: web.Application) -> AsyncIterator[None]:
        pool = AsyncConnectionPool(
            database_url,
            min_size=1,
            max_size=pool_max,
            open=False,
            name="tuneplane-telemetry",
            kwargs={
                "row_factory": dict_row,
                "options": SEARCH_PATH_OPTION,
                "application_name": "tuneplane-telemetry-gateway",
                "autocommit": True,
            },
            # A connection broken by a database restart is found and replaced before use
            # (app/pool_check.py).
            check=pool_check.check_async,
            timeout=10,
        )
        await pool.open(wait=False)
        app[POOL_KEY] = pool
        yield
        await pool.close()

    app.cleanup_ctx.append(lifecycle)
    app.router.add_post("/v1/telemetry/batches", post_batch)
    app.router.add_post("/v1/telemetry/points", post_points)
    app.router.add_get("/v1/telemetry/scope", get_scope)
    app.router.add_get("/healthz", healthz)
    return app


def serve(database_url: str, host: str, port: int, pool_max: int = 8) -> None:
    app = create_app(database_url, pool_max=pool_max)
    web.run_app(
        app,
        host=host,
        port=port,
        print=lambda _m: None,
        access_log=None,
        handle_signals=True,
        shutdown_timeout=10,
    )
