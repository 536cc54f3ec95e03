"""Refusals: the one shape a rule-breaking request takes, from a stored function to an HTTP 4xx.

Stored functions refuse with a custom SQLSTATE `TPnnn` (nnn is the HTTP status) and name the offending
field in the error's COLUMN slot, e.g.
    RAISE EXCEPTION 'retry key already used for another preview'
        USING ERRCODE = 'TP409', COLUMN = 'retry_key';
"""

from __future__ import annotations

import dataclasses
import logging
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import psycopg

# A refusal echoes at most this much of anything it quotes (a name, a value, a parser's message), so a
# client cannot make an error answer or a log line as large as its input. Every error answer of the
# console and both gateways is built from a Refusal, so this is the one place that bounds them.
MAX_MESSAGE_CHARS = 600
MAX_FIELD_CHARS = 200


def clip(text: str, limit: int = MAX_MESSAGE_CHARS) -> str:
    """`text` cut to `limit` characters, saying how much was left out."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}… ({len(text) - limit} more characters)"


@dataclass
class Refusal(Exception):
    message: str
    status: int = 400
    field: str | None = None
    fields: dict[str, str] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        self.message = clip(self.message)
        if self.field:
            self.field = clip(self.field, MAX_FIELD_CHARS)
        super().__init__(self.message)
        if self.field and self.field not in self.fields:
            self.fields[self.field] = self.message
        if any(len(k) > MAX_FIELD_CHARS or len(v) > MAX_MESSAGE_CHARS for k, v in self.fields.items()):
            self.fields = {clip(k, MAX_FIELD_CHARS): clip(v) for k, v in self.fields.items()}

    def as_json(self) -> dict:
        return {"error": self.message, "status": self.status, "fields": self.fields}


def refusal_from_db(exc: psycopg.Error) -> Refusal | None:
    """A Refusal for a `TPnnn` error raised by a stored function, None for any other database error."""
    code = exc.sqlstate or ""
    if not (code.startswith("TP") and code[2:].isdigit()):
        return None
    diag = exc.diag
    return Refusal(diag.message_primary or str(exc), status=int(code[2:]), field=diag.column_name)


# Errors after which PostgreSQL rolled the whole transaction back, so running it again is safe: a deadlock
# victim (40P01) and a serialization failure (40001). A call that meets one is retried a few times after
# these pauses (seconds); what still fails is answered as retryable (503), never as an internal error.
ROLLED_BACK_SQLSTATES = ("40P01", "40001")
RETRY_PAUSES = (0.02, 0.05, 0.15)


def _database_error(exc: BaseException) -> bool:
    # Not imported here: a process that never imported the driver (a collector) cannot have its errors.
    driver = sys.modules.get("psycopg")
    return driver is not None and isinstance(exc, driver.Error)


def rolled_back(exc: BaseException) -> bool:
    """True for a database error after which the transaction may simply run again."""
    return _database_error(exc) and (exc.sqlstate or "") in ROLLED_BACK_SQLSTATES  # type: ignore[attr-defined]


# The server ended the connection: terminated (pg_terminate_backend, 57P01) or shut down or crashed (57P02).
# The pool's check (app/pool_check.py) replaces such a connection when the end is already waiting on its
# socket; one ended between the check and the call's statement fails that statement.
CONNECTION_ENDED_SQLSTATES = ("57P01", "57P02")


def connection_ended(exc: BaseException) -> bool:
    """True for a database error that says the server ended the connection (or it broke) under a statement.
    The statement did not run, or ran to its end unanswered: only an idempotent call may simply run again.
    Not a pool that could not hand out any connection in time (psycopg_pool.PoolTimeout)."""
    if not _database_error(exc):
        return False
    pool = sys.modules.get("psycopg_pool")
    if pool is not None and isinstance(exc, pool.PoolTimeout):
        return False
    code = exc.sqlstate or ""  # type: ignore[attr-defined]
    return code in CONNECTION_ENDED_SQLSTATES or (
        not code and isinstance(exc, sys.modules["psycopg"].OperationalError)
    )


def describe_db_error(exc: BaseException) -> str:
    """A short, client-safe name for an unexpected database error (no SQL, no parameters)."""
    if _database_error(exc) and exc.sqlstate:  # type: ignore[attr-defined]
        primary = exc.diag.message_primary or type(exc).__name__
        return clip(f"{primary} (SQLSTATE {exc.sqlstate})", MAX_FIELD_CHARS)
    return clip(f"{type(exc).__name__}: {exc}", MAX_FIELD_CHARS)


def log_retry(function: str, exc: BaseException, attempt: int) -> None:
    """Said once per retry of a rolled-back call (or one whose connection the server ended), so a deadlock
    that is retried is still seen in the log."""
    logging.getLogger("tuneplane.db").warning(
        "%s %s (%s); running it again (try %s of %s)",
        function,
        "lost its connection" if connection_ended(exc) else "was rolled back",
        describe_db_error(exc),
        attempt + 1,
        len(RETRY_PAUSES) + 1,
    )


def busy_refusal(action: str, exc: BaseException, tries: int) -> Refusal:
    """The answer when an action kept conflicting with concurrent changes: retryable, never a 500."""
    return Refusal(
        f"{action} conflicted with concurrent changes {tries} times ({describe_db_error(exc)}); "
        "nothing was changed: try again",
        status=503,
    )
