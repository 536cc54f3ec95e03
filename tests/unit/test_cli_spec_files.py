"""Issue 15 point 6: the CLI never prints a traceback for a JobSpec file it cannot use; one line names
the file and the reason (YAML dates, !!binary, .inf, non-UTF-8, sets, bad syntax, deep nesting)."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from tuneplane.app.cli import main

CASES = [
    ("date.yaml", b"recipe: {name: demo}\nenv:\n  WHEN: 2024-01-01\n", "env.WHEN is a date"),
    ("stamp.yaml", b"recipe: {name: demo}\nenv: {T: 2024-01-01 10:00:00}\n", "env.T is a date"),
    ("binary.yaml", b"recipe: {name: demo}\nenv: {B: !!binary aGVsbG8=}\n", "binary data"),
    ("inf.yaml", b"recipe: {name: demo}\npriority: .inf\n", "priority is inf"),
    ("nan.yaml", b"recipe: {name: demo, params: {lr: .nan}}\n", "recipe.params.lr is nan"),
    ("latin1.yaml", b"recipe: {name: demo}\nenv: {A: caf\xe9}\n", "not UTF-8"),
    ("set.yaml", b"recipe: {name: demo}\nenv: !!set {a, b}\n", "env is a set"),
    ("key.yaml", b"recipe: {name: demo}\nenv: {1: x}\n", "is not text"),
    ("list.yaml", b"- recipe\n", "a JobSpec is a mapping"),
    ("bad.yaml", b"recipe: {name: demo\n", "not valid YAML"),
    ("python.yaml", b"recipe: !!python/object/apply:os.system [echo hi]\n", "not valid YAML"),
    ("deep.json", b"[" * 100_000 + b"]" * 100_000, "nested too deeply"),
    ("bad.json", b"{'recipe': 1}", "not valid JSON"),
]


@pytest.mark.parametrize(("name", "content", "reason"), CASES, ids=[c[0] for c in CASES])
def test_unusable_spec_files_are_one_line_errors(
    tmp_path: Path, name: str, content: bytes, reason: str
) -> None:
    spec = tmp_path / name
    spec.write_bytes(content)
    env = {
        "TUNEPLANE_SERVER": "http://127.0.0.1:1",
        "TUNEPLANE_TOKEN": "tpu_x",
        "TUNEPLANE_CONFIG": str(tmp_path / "c.toml"),
    }
    result = CliRunner().invoke(main, ["submit", "--spec", str(spec), "--yes"], env=env)
    output = result.output
    assert result.exit_code == 1, output
    assert "Traceback" not in output
    lines = [line for line in output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("Error: "), output
    assert reason in lines[0] and name in lines[0], output


def test_an_unexpected_error_is_one_line_too(tmp_path: Path) -> None:
    config = tmp_path / "config.toml"
    config.write_bytes(b"server = \xff broken")
    result = CliRunner().invoke(main, ["jobs", "list"], env={"TUNEPLANE_CONFIG": str(config)})
    assert result.exit_code != 0 and "Traceback" not in result.output
    assert result.output.startswith("Error: "), result.output
