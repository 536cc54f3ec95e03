"""numpy columns sent to PostgreSQL as binary arrays (bigint[], integer[], double precision[]).

psycopg dumps a Python list element by element in text (a regular expression per element to decide on
quoting): for the per-bucket aggregates of one batch that is most of the gateway's own CPU. These dumpers
write PostgreSQL's binary array format straight from the numpy buffer: a 20-byte header, then for each
element its length and its big-endian bytes (length -1 and no bytes for a NULL).
"""

from __future__ import annotations

import struct

import numpy as np
import psycopg
from psycopg.adapt import Dumper
from psycopg.pq import Format


class PgArray:
    """A 1-d array for one query parameter; `nulls` marks the elements sent as NULL."""

    __slots__ = ("nulls", "values")
    element_oid = 0
    array_oid = 0
    dtype = ""

    def __init__(self, values: np.ndarray | list, nulls: np.ndarray | None = None) -> None:
        self.values = np.asarray(values, dtype=self.dtype)
        self.nulls = nulls if nulls is not None and nulls.any() else None


class Int8Array(PgArray):
    element_oid, array_oid, dtype = 20, 1016, ">i8"


class Int4Array(PgArray):
    element_oid, array_oid, dtype = 23, 1007, ">i4"


class Float8Array(PgArray):
    element_oid, array_oid, dtype = 701, 1022, ">f8"


def encode(array: PgArray) -> bytes:
    values = array.values
    n = len(values)
    if n == 0:
        return struct.pack(">iii", 0, 0, array.element_oid)
    width = values.dtype.itemsize
    rows = np.empty(n, dtype=[("length", ">i4"), ("value", values.dtype)])
    rows["length"] = width
    rows["value"] = values
    head = struct.pack(">iiiii", 1, array.nulls is not None, array.element_oid, n, 1)
    if array.nulls is None:
        return head + rows.tobytes()
    rows["length"][array.nulls] = -1
    keep = np.ones((n, 4 + width), dtype=bool)
    keep[array.nulls, 4:] = False  # a NULL is its length (-1) alone
    return head + rows.view(np.uint8).reshape(n, 4 + width)[keep].tobytes()


def _dumper(cls: type[PgArray]) -> type[Dumper]:
    class ArrayDumper(Dumper):
        format = Format.BINARY
        oid = cls.array_oid

        def dump(self, obj: PgArray) -> bytes:
            return encode(obj)

    ArrayDumper.__name__ = f"{cls.__name__}Dumper"
    return ArrayDumper


for _cls in (Int8Array, Int4Array, Float8Array):
    psycopg.adapters.register_dumper(_cls, _dumper(_cls))
