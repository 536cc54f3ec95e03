"""The SQL in docs/runbook.md's fleets section runs as written."""

from __future__ import annotations

import re

from psycopg.types.json import Jsonb

from tests.conftest import REPO
from tests.node_helpers import enroll, make_fleet, make_token
from tuneplane.app.db import Database


def _runbook_statements() -> list[str]:
    text = (REPO / "docs" / "runbook.md").read_text()
    section = text[text.index("## Fleets and nodes") :]
    section = section[: section.find("\n## ", 5)] if "\n## " in section[5:] else section
    statements = []
    for block in re.findall(r"```sql\n(.*?)```", section, flags=re.S):
        code = "\n".join(line.split("--", 1)[0] for line in block.splitlines())
        statements += [part.strip() for part in code.split(";") if part.strip()]
    return statements


def test_every_fleet_runbook_statement_runs(db: Database) -> None:
    make_fleet(db)
    node, _ = enroll(db, make_token(db), "n1")
    epoch = db.call("node_session_opened", node["node_id"], "127.0.0.1", "t")[0]["epoch"]
    db.call(
        "report_node_capacity",
        node["node_id"],
        epoch,
        Jsonb({"cpus": 2, "memory_bytes": 1 << 30, "gpus": [], "container_runtimes": []}),
    )
    statements = _runbook_statements()
    assert len(statements) >= 12
    ran = 0
    for statement in statements:
        if "<that id>" in statement:
            last = db.fetch_one("SELECT max(id) AS id FROM node_commands")["id"]
            statement = statement.replace("<that id>", str(last))
        if "retire_node" in statement:
            continue  # final; run last
        db.fetch_all(statement)
        ran += 1
    db.fetch_all("SELECT * FROM retire_node('gpu/n1', 'decommissioned')")
    assert ran == len(statements) - 1
    assert db.fetch_one("SELECT scheduling_state FROM nodes")["scheduling_state"] == "retired"
