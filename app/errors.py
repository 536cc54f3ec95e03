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

# A refusal echoes at most this much of anything it quotes (a name, a value, a parser's message), so a
# client cannot make an error answer or a log line as large as its input.
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
