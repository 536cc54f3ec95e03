"""JobSpec validation, image reference normalisation and canonical JSON (no database)."""

from __future__ import annotations

import pytest

from tuneplane.app.errors import Refusal
from tuneplane.app.submission.canonical import canonical_json, digest_of
from tuneplane.app.submission.images import ImageRefError, normalise_image_ref
from tuneplane.app.submission.jobspec import parse_jobspec, parse_memory


def refusal(data: dict) -> Refusal:
    with pytest.raises(Refusal) as err:
        parse_jobspec(data)
    assert err.value.status == 422
    return err.value


def test_exactly_one_input_kind() -> None:
    assert "found none" in refusal({}).message
    both = refusal({"recipe": {"name": "demo"}, "image": {"ref": "ubuntu", "command": "true"}})
    assert "found recipe, image" in both.message and both.field == "input"
    assert parse_jobspec({"recipe": {"name": "demo"}}).input_kind == "recipe"


def test_unknown_fields_are_errors_at_every_level() -> None:
    err = refusal({"recipe": {"name": "demo", "extra": 1}, "resources": {"gpu": 1}, "colour": "red"})
    assert set(err.fields) == {"recipe.extra", "resources.gpu", "colour"}
    assert all(v == "unknown field" for v in err.fields.values())


def test_defaults_and_memory_units() -> None:
    spec = parse_jobspec({"recipe": {"name": "demo"}, "resources": {"memory_per_node": "16G"}})
    assert spec.resources.nodes == 1 and spec.resources.gpus_per_node == 0 and spec.max_attempts == 1
    assert spec.resources.memory_per_node == 16 * 1024**3
    assert parse_memory("512M") == 512 * 1024**2 and parse_memory("1.5Gi") == 1536 * 1024**2
    assert parse_memory("2GB") == 2 * 1024**3 and parse_memory(1000) == 1000
    for bad in ("lots", "-1G", True, -5):
        with pytest.raises(ValueError):
            parse_memory(bad)


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        ({"recipe": {"name": "demo"}, "resources": {"nodes": 0}}, "resources.nodes"),
        ({"recipe": {"name": "demo"}, "resources": {"gpus_per_node": -1}}, "resources.gpus_per_node"),
        ({"recipe": {"name": "demo"}, "env": {"1BAD": "x"}}, "env"),
        ({"recipe": {"name": "demo"}, "env": {"TUNEPLANE_TOKEN": "x"}}, "env"),
        ({"recipe": {"name": "demo"}, "max_attempts": 0}, "max_attempts"),
        ({"recipe": {"name": "demo"}, "fleet": "Bad Fleet"}, "fleet"),
        ({"recipe": {"name": "demo", "params": {"lr": float("nan")}}}, "recipe.params"),
        ({"recipe": {"name": "demo", "params": {"steps": [1]}}}, "recipe.params"),
        ({"source": {"archive": "abc", "entrypoint": "x"}}, "source.archive"),
        ({"source": {"archive": "sha256:" + "a" * 64, "entrypoint": ""}}, "source.entrypoint"),
        ({"image": {"ref": "Not Valid", "command": "x"}}, "image.ref"),
        ({"recipe": {"name": "demo"}, "outputs": [{"name": "m", "path": "../x"}]}, "outputs.0.path"),
    ],
)
def test_bad_fields_are_named(spec: dict, field: str) -> None:
    assert field in refusal(spec).fields


def test_archive_digest_is_normalised() -> None:
    spec = parse_jobspec({"source": {"archive": "A" * 64, "entrypoint": "python t.py"}})
    assert spec.source.archive == "sha256:" + "a" * 64


@pytest.mark.parametrize(
    ("raw", "normalised"),
    [
        ("pytorch/pytorch:2.3", "docker.io/pytorch/pytorch:2.3"),
        ("ubuntu", "docker.io/library/ubuntu:latest"),
        ("ubuntu:22.04", "docker.io/library/ubuntu:22.04"),
        ("ghcr.io/org/team/img:v1", "ghcr.io/org/team/img:v1"),
        ("localhost:5000/img", "localhost:5000/img:latest"),
        (
            "nvcr.io/nvidia/pytorch:24.01-py3@sha256:" + "b" * 64,
            "nvcr.io/nvidia/pytorch:24.01-py3@sha256:" + "b" * 64,
        ),
        ("img@sha256:" + "c" * 64, "docker.io/library/img@sha256:" + "c" * 64),
    ],
)
def test_image_references_are_normalised(raw: str, normalised: str) -> None:
    assert normalise_image_ref(raw).normalised == normalised


@pytest.mark.parametrize("bad", ["UPPER/case", "img@sha256:short", "a b", "img:bad tag", "", "repo/:tag"])
def test_bad_image_references_are_refused(bad: str) -> None:
    with pytest.raises(ImageRefError):
        normalise_image_ref(bad)


def test_canonical_json_sorts_keys_and_has_no_whitespace() -> None:
    assert canonical_json({"b": 1, "a": [True, None, "é"], "c": {"y": 1.0, "x": 1e-05}}) == (
        '{"a":[true,null,"é"],"b":1,"c":{"x":0.00001,"y":1.0}}'
    )
    assert digest_of({"a": 1}) == digest_of({"a": 1}) != digest_of({"a": 2})
    with pytest.raises(ValueError):
        canonical_json(float("inf"))
