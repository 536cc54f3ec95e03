"""Issuing a member's telemetry token: the plaintext goes to the member's environment, the hash to the DB."""

from __future__ import annotations

import datetime as dt

from tuneplane.app import db_functions as fn
from tuneplane.app.db import Database
from tuneplane.app.security import new_token

TOKEN_PREFIX = "tpt"
ENV_URL = "TUNEPLANE_TELEMETRY_URL"
ENV_TOKEN = "TUNEPLANE_TELEMETRY_TOKEN"


def issue_member_token(
    db: Database, job_id: int, attempt: int, member_rank: int, ttl: dt.timedelta | None = None
) -> str:
    """A new token that may write only this member's telemetry (see issue_telemetry_token)."""
    plaintext, digest = new_token(TOKEN_PREFIX)
    db.call(fn.issue_telemetry_token, job_id, attempt, member_rank, digest, ttl)
    return plaintext


def member_environment(gateway_url: str, token: str) -> dict[str, str]:
    """What the launch code puts into a member's (and its collector's) environment."""
    return {ENV_URL: gateway_url, ENV_TOKEN: token}
