"""Refusals: the one shape a rule-breaking request takes, from a stored function to an HTTP 4xx.

Stored functions refuse with a custom SQLSTATE `TPnnn` (nnn is the HTTP status) and name the offending
field in the error's COLUMN slot, e.g.
    RAISE EXCEPTION 'retry key already used for another preview'
        USING ERRCODE = 'TP409', COLUMN = 'retry_key';
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import psycopg


@dataclass
class Refusal(Exception):
    message: str
    status: int = 400
    field: str | None = None
    fields: dict[str, str] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        super().__init__(self.message)
        if self.field and self.field not in self.fields:
            self.fields[self.field] = self.message

    def as_json(self) -> dict:
        return {"error": self.message, "status": self.status, "fields": self.fields}


def refusal_from_db(exc: psycopg.Error) -> Refusal | None:
    """A Refusal for a `TPnnn` error raised by a stored function, None for any other database error."""
    code = exc.sqlstate or ""
    if not (code.startswith("TP") and code[2:].isdigit()):
        return None
    diag = exc.diag
    return Refusal(diag.message_primary or str(exc), status=int(code[2:]), field=diag.column_name)
