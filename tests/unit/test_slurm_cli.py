"""Parsing Slurm's text output (22.05 and the formats older and newer releases share) and the version gate."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from tuneplane.workers.slurm.cli import (
    SlurmCli,
    UnsupportedSlurm,
    parse_gpus,
    parse_key_values,
    parse_limit,
    parse_minutes,
)


@pytest.mark.parametrize(
    ("gres", "expected"),
    [
        ("gpu:2", (2, "gpu")),
        ("gpu:a100:4(S:0-1)", (4, "a100")),
        ("shard:8,gpu:h100:8", (8, "h100")),
        ("(null)", (0, "gpu")),
        ("", (0, "gpu")),
    ],
)
def test_gpus_from_a_nodes_gres(gres: str, expected: tuple[int, str]) -> None:
    assert parse_gpus(gres) == expected


@pytest.mark.parametrize(
    ("value", "minutes"),
    [
        ("UNLIMITED", None),
        ("60", 60),
        ("01:00:00", 60),
        ("1-00:00:00", 1440),
        ("30:00", 30),
        ("00:30:01", 31),
    ],
)
def test_time_limits(value: str, minutes: int | None) -> None:
    assert parse_minutes(value) == minutes


def test_partition_line() -> None:
    line = "PartitionName=batch AllowGroups=ALL MaxNodes=UNLIMITED MaxTime=01:00:00 TotalNodes=2 State=UP"
    fields = parse_key_values(line)
    assert fields["PartitionName"] == "batch"
    assert parse_limit(fields["MaxNodes"]) is None and parse_limit("4") == 4


def _fake_sinfo(tmp_path: Path, output: str) -> None:
    script = tmp_path / "sinfo"
    script.write_text(f"#!/bin/sh\necho '{output}'\n")
    script.chmod(script.stat().st_mode | stat.S_IEXEC)


@pytest.mark.parametrize(
    ("output", "version"), [("slurm-wlm 22.05.8", "22.05.8"), ("slurm 23.11.4", "23.11.4")]
)
def test_supported_versions(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, output: str, version: str
) -> None:
    _fake_sinfo(tmp_path, output)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    assert SlurmCli(None).version() == version


def test_an_old_slurm_is_refused_with_the_reason(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_sinfo(tmp_path, "slurm 19.05.5")
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    with pytest.raises(UnsupportedSlurm, match=r"19\.05\.5 is older than 20\.11"):
        SlurmCli(None).version()


def test_missing_binaries_are_refused_by_name(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(UnsupportedSlurm, match="sinfo is not installed"):
        SlurmCli(None).version()
