"""An HTTP client for the CLI: JSON in and out, TLS verification always on, one-line errors."""

from __future__ import annotations

import time
from typing import Any

import httpx

from tuneplane.app.client.config import ClientConfig
from tuneplane.app.client.transport import (
    ClientError,
    check_transport,
    is_loopback_host,
    retry_after,
    verify_setting,
)

__all__ = ["ApiClient", "ClientError", "check_transport", "is_loopback_host", "verify_setting"]

# How long a read waits out 503 + Retry-After answers in all (a failover takes seconds: docs/operations.md).
WAIT_OUT_503_S = 30.0


class ApiClient:
    def __init__(self, config: ClientConfig, *, require_token: bool = True, timeout: float = 30.0) -> None:
        if not config.server:
            raise ClientError(
                "no server configured: pass --server, set TUNEPLANE_SERVER, or run `tuneplane login`"
            )
        if require_token and not config.token:
            raise ClientError("no API token: pass --token, set TUNEPLANE_TOKEN, or run `tuneplane login`")
        check_transport(config.server)
        headers = {"Accept": "application/json", "User-Agent": "tuneplane-cli"}
        if config.token:
            headers["Authorization"] = f"Bearer {config.token}"
        self.config = config
        self.http = httpx.Client(
            base_url=config.server.rstrip("/"),
            headers=headers,
            timeout=timeout,
            verify=verify_setting(config.ca_bundle),
        )

    def close(self) -> None:
        self.http.close()

    def __enter__(self) -> ApiClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def request(self, method: str, path: str, **kwargs: Any) -> Any:
        # A 503 with Retry-After (the database restarting or failing over: app/reconnect.py) is waited out
        # for a read, within WAIT_OUT_503_S; a write is not sent twice (the user runs it again).
        deadline = time.monotonic() + WAIT_OUT_503_S
        while True:
            try:
                response = self.http.request(method, path, **kwargs)
            except httpx.ConnectError as exc:
                raise ClientError(f"cannot connect to {self.config.server}: {exc}") from exc
            except httpx.HTTPError as exc:
                raise ClientError(f"request to {self.config.server} failed: {exc}") from exc
            pause = retry_after(response.status_code, response.headers.get("Retry-After"))
            if method not in ("GET", "HEAD") or pause is None or time.monotonic() + pause > deadline:
                return self._decode(response)
            time.sleep(pause)

    def get(self, path: str, **kwargs: Any) -> Any:
        return self.request("GET", path, **kwargs)

    def post(self, path: str, **kwargs: Any) -> Any:
        return self.request("POST", path, **kwargs)

    @staticmethod
    def _decode(response: httpx.Response) -> Any:
        try:
            body = response.json()
        except ValueError:
            body = None
        if response.is_success:
            return body
        if isinstance(body, dict) and "error" in body:
            raise ClientError(body["error"], response.status_code, body.get("fields"))
        raise ClientError(f"server answered HTTP {response.status_code}", response.status_code)
