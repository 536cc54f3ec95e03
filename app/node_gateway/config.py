"""Where agents find the node gateway: `TUNEPLANE_NODE_GATEWAY_URL` (the agent's --server default, and the
URL the console shows in enrollment commands). `tuneplane up` runs the gateway on the console port + 1."""

from __future__ import annotations

import os

ENV_NODE_GATEWAY_URL = "TUNEPLANE_NODE_GATEWAY_URL"
DEFAULT_PORT = 8081


def gateway_url() -> str | None:
    return os.environ.get(ENV_NODE_GATEWAY_URL) or None
