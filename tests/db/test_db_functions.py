"""The stored-function registry (app/db_functions.py) against a freshly migrated database and the source.

1. Every registered function exists in schema `tuneplane` with the registered argument types, and accepts
   every argument count a call site passes (the rest have defaults). A renamed or re-typed function fails
   here, naming the signatures the database has.
2. Every call from app/, workers/ and tuneplane/ names its function through the registry (`fn.<name>`),
   never as a bare string; raw SQL that calls `tuneplane.<name>(…)` names a registered function.
3. Nothing is registered that no code calls.
"""

from __future__ import annotations

import ast
import re
from collections import defaultdict
from pathlib import Path

import psycopg

from tuneplane.app import db_functions as fn

REPO = Path(__file__).resolve().parents[2]
SOURCES = ("app", "workers", "tuneplane")
CALLS = {"call", "call_retrying", "call_one"}
# Calls whose function is a variable, each a pass-through of a registered name, with the reason.
PASS_THROUGH = {
    ("app/db.py", "function"): "Database.call_retrying passes its argument on to call",
    ("app/node_gateway/aiodb.py", "function"): "AsyncDatabase.call_one/call_retrying pass their argument on",
    (
        "app/node_gateway/reports.py",
        "function",
    ): "a report kind's function, from REPORT_FUNCTIONS (fn.* values)",
    (
        "app/node_gateway/report_batch.py",
        "function",
    ): "ReportBatcher runs the report function reports.py passed it (fn.* values)",
    ("workers/slurm/worker.py", "function"): "SlurmWorker.call passes its argument on to Database.call",
    ("workers/sweeps.py", "function"): "_counted(ctx, fn.<name>, …) calls a sweep's function",
}
RAW_SQL = re.compile(r"tuneplane\.([a-z_][a-z0-9_]*)\(")


def _python_files() -> list[Path]:
    return [p for root in SOURCES for p in sorted((REPO / root).rglob("*.py"))]


def _call_sites() -> tuple[dict[str, set[int]], list[str]]:
    """(registered name -> argument counts its call sites pass, problems found)."""
    counts: dict[str, set[int]] = defaultdict(set)
    problems = []
    for path in _python_files():
        rel = path.relative_to(REPO).as_posix()
        source = path.read_text()
        for node in ast.walk(ast.parse(source)):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
                continue
            if node.func.attr not in CALLS or not node.args:
                continue
            first = node.args[0]
            where = f"{rel}:{node.lineno}"
            if isinstance(first, ast.Constant) and isinstance(first.value, str):
                problems.append(f"{where}: calls {first.value!r} by a bare string; use fn.{first.value}")
            elif (
                isinstance(first, ast.Attribute)
                and isinstance(first.value, ast.Name)
                and first.value.id == "fn"
            ):
                if first.attr not in fn.REGISTRY:
                    problems.append(f"{where}: fn.{first.attr} is not in app/db_functions.py")
                elif not any(isinstance(a, ast.Starred) for a in node.args[1:]):
                    counts[first.attr].add(len(node.args) - 1)
            elif (rel, ast.unparse(first)) not in PASS_THROUGH:
                problems.append(f"{where}: calls {ast.unparse(first)}, which is not a registered fn.<name>")
        for match in RAW_SQL.finditer(source):
            name = match.group(1)
            if name not in fn.REGISTRY:
                line = source[: match.start()].count("\n") + 1
                problems.append(f"{rel}:{line}: SQL calls tuneplane.{name}(…), which is not registered")
            else:
                counts.setdefault(name, set())
        for match in re.finditer(r"\bfn\.([a-z_][a-z0-9_]*)\b", source):
            counts.setdefault(match.group(1), set())
    return counts, problems


def test_every_call_names_a_registered_function() -> None:
    _counts, problems = _call_sites()
    assert problems == [], "\n".join(problems)
    misnamed = [
        f"fn.{attr} names {value!r}"
        for attr, value in vars(fn).items()
        if isinstance(value, fn.StoredFunction) and attr != value
    ]
    assert misnamed == [], "a registry entry's attribute must be the function's name"


def test_nothing_is_registered_that_no_code_calls() -> None:
    counts, _problems = _call_sites()
    assert sorted(set(fn.REGISTRY) - set(counts)) == []


def test_every_registered_function_exists_with_the_arguments_its_callers_pass(db_url: str) -> None:
    counts, _problems = _call_sites()
    with psycopg.connect(db_url) as conn:
        rows = conn.execute(
            """
            SELECT p.proname, p.pronargs, p.pronargdefaults,
                   array(SELECT format_type(t, NULL) FROM unnest(p.proargtypes) t) AS types
              FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
             WHERE n.nspname = 'tuneplane' AND p.proname = ANY(%s)
            """,
            (list(fn.REGISTRY),),
        ).fetchall()
    found: dict[str, list[tuple[int, int, list[str]]]] = defaultdict(list)
    for name, nargs, ndefaults, types in rows:
        found[name].append((nargs, ndefaults, types))
    wrong = []
    for name, function in sorted(fn.REGISTRY.items()):
        passed = counts.get(name) or {len(function.args)}
        if max(passed) > len(function.args):
            wrong.append(
                f"{name}: a call site passes {max(passed)} arguments, the registry lists {function.args}"
            )
        ok = any(
            tuple(types[: len(function.args)]) == function.args
            and nargs - ndefaults <= min(passed)
            and max(passed) <= nargs
            for nargs, ndefaults, types in found[name]
        )
        if not ok:
            have = "; ".join(f"{name}({', '.join(t)}) with {d} default(s)" for _n, d, t in found[name])
            wrong.append(
                f"tuneplane.{name}({', '.join(function.args)}) called with {sorted(passed)} argument(s): "
                f"the database has {have or 'no function of that name'}"
            )
    assert wrong == [], (
        "stored functions Python calls (app/db_functions.py) that a migrated database does not have as "
        "called — renamed, re-typed or dropped? Fix the registry and its call sites:\n" + "\n".join(wrong)
    )
