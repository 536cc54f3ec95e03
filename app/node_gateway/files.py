"""Files agents fetch from the gateway, authenticated like the control session: GET /v1/files/<kind>/<name>.

Nothing is served yet: the launch issue registers a `capsule` provider here. A provider is
`async def provider(request, node: dict, name: str) -> web.StreamResponse` and must itself check that the
node may read `name` (e.g. the capsule belongs to one of its members).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from aiohttp import web

FileProvider = Callable[[web.Request, dict, str], Awaitable[web.StreamResponse]]

FILE_PROVIDERS: dict[str, FileProvider] = {}


def register_file_provider(kind: str, provider: FileProvider) -> None:
    FILE_PROVIDERS[kind] = provider
