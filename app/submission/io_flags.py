"""The short text forms of a JobSpec's outputs and inputs, shared by the CLI flags and the console dialog:

    output  NAME=PATH[:DELIVERY]   e.g. ckpt=checkpoint, ckpt=checkpoint:shared
    input   NAME=REF[:PATH]        e.g. base=12/ckpt, base=12/checkpoint.2@0:weights, base=sha256:ab…

Only the shape is checked here (ValueError naming the text); names, paths, delivery and references are
validated by the JobSpec and pinned by the preview like any other.
"""

from __future__ import annotations

DELIVERIES = ("object", "shared")


def parse_output(text: str) -> dict:
    name, sep, rest = text.strip().partition("=")
    if not sep or not name.strip() or not rest.strip():
        raise ValueError(f"an output is NAME=PATH[:DELIVERY], got {text!r}")
    path, colon, delivery = rest.strip().rpartition(":")
    if not colon or delivery not in DELIVERIES:
        path, delivery = rest.strip(), ""
    output = {"name": name.strip(), "path": path}
    if delivery:
        output["delivery"] = delivery
    return output


def parse_input(text: str) -> dict:
    name, sep, rest = text.strip().partition("=")
    if not sep or not name.strip() or not rest.strip():
        raise ValueError(f"an input is NAME=REF[:PATH], got {text!r}")
    ref, colon, path = rest.strip().partition(":")
    if ref == "sha256":  # sha256:DIGEST[:PATH]
        digest, colon, path = path.partition(":")
        ref = f"sha256:{digest}"
    entry = {"name": name.strip(), "artifact": ref}
    if colon and path:
        entry["path"] = path
    return entry
