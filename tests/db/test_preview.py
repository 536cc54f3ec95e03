"""Preview resolution: fleet choice, policy, pins, digest, immutability, expiry; a refusal stores nothing."""

from __future__ import annotations

import hashlib

import psycopg
import pytest

from tests.submission_setup import GIB, add_fleet, add_node, add_user, one_local_fleet
from tuneplane.app.db import Database
from tuneplane.app.errors import Refusal
from tuneplane.app.submission import service
from tuneplane.app.submission.canonical import canonical_json, digest_of

DEMO = {"recipe": {"name": "demo", "params": {"steps": 5}}}


def preview_count(db: Database) -> int:
    return db.fetch_one("SELECT count(*) AS n FROM previews")["n"]


def refused(db: Database, user: int, spec: dict) -> Refusal:
    with pytest.raises(Refusal) as err:
        service.create_preview(db, user, spec)
    assert preview_count(db) == 0, "a refused preview must store nothing"
    return err.value


def test_single_capable_fleet_is_chosen_and_the_preview_says_so(db: Database) -> None:
    user = add_user(db, "alice")
    one_local_fleet(db)
    preview = service.create_preview(db, user, DEMO)
    fleet = preview["resolved"]["fleet"]
    assert fleet["name"] == "local" and fleet["backend"] == "node" and fleet["chosen"] == "automatic"
    assert any("chose local" in w for w in preview["resolved"]["warnings"])
    assert preview["resolved"]["input"]["params"]["steps"] == 5
    assert preview["resolved"]["input"]["params"]["lr"] == 0.1  # defaults applied and pinned


def test_no_capable_fleet_is_refused_listing_the_fleets(db: Database) -> None:
    user = add_user(db, "alice")
    small = add_fleet(db, "small")
    add_node(db, small, "s1", gpus=1)
    err = refused(db, user, {**DEMO, "resources": {"gpus_per_node": 4}})
    assert err.status == 422 and err.field == "fleet"
    assert "no fleet can satisfy" in err.message and "small (0 of 1 nodes fit)" in err.message


def test_several_capable_fleets_are_refused_listing_them(db: Database) -> None:
    user = add_user(db, "alice")
    one_local_fleet(db, "alpha")
    one_local_fleet(db, "beta")
    err = refused(db, user, DEMO)
    assert err.field == "fleet" and "alpha, beta" in err.message and "several fleets" in err.message
    named = service.create_preview(db, user, {**DEMO, "fleet": "beta"})
    assert named["resolved"]["fleet"]["name"] == "beta" and named["resolved"]["fleet"]["chosen"] == "named"


def test_named_fleet_that_cannot_satisfy_is_refused_without_fallback(db: Database) -> None:
    user = add_user(db, "alice")
    one_local_fleet(db, "cpu-only")
    big = add_fleet(db, "gpus", backend="slurm")
    add_node(db, big, "g1", gpus=8)
    err = refused(db, user, {**DEMO, "fleet": "cpu-only", "resources": {"gpus_per_node": 2}})
    assert err.status == 422 and err.field == "fleet" and "fleet cpu-only cannot satisfy" in err.message


def test_unknown_fleet_is_a_404_naming_the_fleets(db: Database) -> None:
    user = add_user(db, "alice")
    one_local_fleet(db)
    err = refused(db, user, {**DEMO, "fleet": "nope"})
    assert err.status == 404 and err.field == "fleet" and "local" in err.message


def test_no_fleets_at_all_is_refused(db: Database) -> None:
    user = add_user(db, "alice")
    err = refused(db, user, DEMO)
    assert err.field == "fleet" and "no fleets" in err.message


def test_multi_node_request_needs_that_many_capable_nodes_and_retired_do_not_count(db: Database) -> None:
    user = add_user(db, "alice")
    fleet = add_fleet(db, "f")
    add_node(db, fleet, "n1", gpus=2)
    add_node(db, fleet, "n2", gpus=2, state="retired")
    add_node(db, fleet, "n3", gpus=1)
    spec = {**DEMO, "resources": {"nodes": 2, "gpus_per_node": 2}}
    err = refused(db, user, spec)
    assert "1 of 2 nodes fit" in err.message
    add_node(db, fleet, "n4", gpus=2, state="cordoned")  # cordoned is temporary: capacity still counts
    preview = service.create_preview(db, user, spec)
    assert preview["resolved"]["resources"]["total_gpus"] == 4
    assert preview["observed"]["capable_but_unschedulable"] == 1


def test_memory_and_cpus_must_fit_on_one_node(db: Database) -> None:
    user = add_user(db, "alice")
    fleet = add_fleet(db, "f")
    add_node(db, fleet, "n1", cpus=4, memory=8 * GIB)
    err = refused(db, user, {**DEMO, "resources": {"memory_per_node": "16G"}})
    assert "16 GiB memory" in err.message
    err = refused(db, user, {**DEMO, "resources": {"cpus_per_node": 8}})
    assert "8 CPUs" in err.message


def test_image_job_needs_a_node_with_a_container_runtime(db: Database, registry) -> None:
    user = add_user(db, "alice")
    plain = add_fleet(db, "plain")
    add_node(db, plain, "p1")
    spec = {"image": {"ref": f"{registry.host}/tuneplane/busybox:1", "command": "echo 1"}}
    err = refused(db, user, spec)
    assert "container runtime" in err.message
    boxes = add_fleet(db, "boxes")
    add_node(db, boxes, "b1", runtimes=("docker",))
    preview = service.create_preview(db, user, spec)
    assert preview["resolved"]["fleet"]["name"] == "boxes"
    # The tag is resolved to its digest through the registry's API and pinned.
    pinned = f"{registry.host}/tuneplane/busybox:1@{registry.digests['1']}"
    assert preview["resolved"]["runtime"] == {"kind": "image", "image": pinned}
    assert preview["resolved"]["input"]["image"] == pinned


def test_unknown_image_or_tag_is_refused_at_preview(db: Database, registry) -> None:
    user = add_user(db, "alice")
    boxes = add_fleet(db, "boxes")
    add_node(db, boxes, "b1", runtimes=("podman",))
    for ref in (f"{registry.host}/tuneplane/busybox:no-such-tag", f"{registry.host}/tuneplane/nothing:1"):
        err = refused(db, user, {"image": {"ref": ref, "command": "echo 1"}})
        assert err.status == 422 and err.field == "image.ref" and ref.split("/", 1)[1] in err.message


def test_policy_limits_refuse_too_many_gpus_and_nodes_per_user(db: Database) -> None:
    user = add_user(db, "alice")
    admin = add_user(db, "root", "admin")
    fleet = add_fleet(db, "f")
    for i in range(3):
        add_node(db, fleet, f"n{i}", gpus=8)
    db.call("set_user_limits", admin, "alice", 8, 2)
    err = refused(db, user, {**DEMO, "resources": {"nodes": 2, "gpus_per_node": 8}})
    assert (
        err.status == 403 and err.field == "resources.gpus_per_node" and "limit for alice is 8" in err.message
    )
    err = refused(db, user, {**DEMO, "resources": {"nodes": 3}})
    assert err.status == 403 and err.field == "resources.nodes"
    ok = service.create_preview(db, user, {**DEMO, "resources": {"nodes": 1, "gpus_per_node": 8}})
    assert ok["resolved"]["policy"] == {"max_gpus_per_job": 8, "max_nodes_per_job": 2}
    with pytest.raises(Refusal) as not_admin:
        db.call("set_user_limits", user, "alice", 100, 100)
    assert not_admin.value.status == 403


def test_pins_integration_files_and_python_environment(db: Database) -> None:
    from importlib.metadata import version

    user = add_user(db, "alice")
    one_local_fleet(db)
    resolved = service.create_preview(db, user, DEMO)["resolved"]
    from tuneplane.workers.integrations import demo

    with open(demo.__file__, "rb") as handle:
        file_sha = hashlib.sha256(handle.read()).hexdigest()
    assert resolved["integration"]["files"] == {"demo.py": file_sha}
    assert resolved["integration"]["sha256"] == digest_of({"demo.py": file_sha})
    assert resolved["runtime"]["packages"] == {
        "numpy": version("numpy"),
        "tensorboardX": version("tensorboardX"),
    }


def test_digest_is_sha256_of_the_canonical_json_python_computes_the_same(db: Database) -> None:
    user = add_user(db, "alice")
    one_local_fleet(db)
    preview = service.create_preview(
        db, user, {"recipe": {"name": "demo", "params": {"lr": 1e-05}}, "env": {"NOTE": 'é "q" \n\t'}}
    )
    assert canonical_json(preview["resolved"]) == preview["canonical"]
    assert digest_of(preview["resolved"]) == preview["digest"]
    assert hashlib.sha256(preview["canonical"].encode()).hexdigest() == preview["digest"]


def test_same_spec_gives_the_same_digest_and_another_spec_another(db: Database) -> None:
    user = add_user(db, "alice")
    one_local_fleet(db)
    first = service.create_preview(db, user, DEMO)
    second = service.create_preview(db, user, DEMO)
    other = service.create_preview(db, user, {"recipe": {"name": "demo", "params": {"steps": 6}}})
    assert first["id"] != second["id"] and first["digest"] == second["digest"]
    assert other["digest"] != first["digest"]


def test_previews_are_immutable(db: Database, db_url: str) -> None:
    user = add_user(db, "alice")
    one_local_fleet(db)
    preview = service.create_preview(db, user, DEMO)
    for statement in (
        "UPDATE previews SET digest = repeat('0', 64)",
        "DELETE FROM previews",
        "TRUNCATE previews CASCADE",
    ):
        with pytest.raises(Refusal) as err:
            db.fetch_all(statement)
        assert err.value.status == 409 and "immutable" in err.value.message
    assert service.get_preview(db, user, preview["id"])["digest"] == preview["digest"]


def test_source_archive_must_be_uploaded_by_the_owner(db: Database) -> None:
    alice = add_user(db, "alice")
    bob = add_user(db, "bob")
    one_local_fleet(db)
    sha = "ab" * 32
    db.call("record_source_archive", bob, sha, 100, 3, 300)
    spec = {"source": {"archive": f"sha256:{sha}", "entrypoint": "python train.py"}}
    err = refused(db, alice, spec)
    assert err.status == 404 and err.field == "source.archive"
    preview = service.create_preview(db, bob, spec)
    assert preview["resolved"]["input"]["archive"] == {
        "sha256": sha,
        "size_bytes": 100,
        "member_count": 3,
        "unpacked_bytes": 300,
    }
    assert preview["resolved"]["integration"]["name"] == "script"


def test_an_unresolvable_input_is_refused_not_dropped(db: Database) -> None:
    # Input pinning itself is tested in tests/db/test_artifact_preview.py (artifacts issue).
    user = add_user(db, "alice")
    one_local_fleet(db)
    err = refused(db, user, {**DEMO, "inputs": [{"name": "data", "artifact": "job-1/model"}]})
    assert err.field == "inputs.0.artifact"


def test_unknown_recipe_and_bad_params_are_refused_by_field(db: Database) -> None:
    user = add_user(db, "alice")
    one_local_fleet(db)
    assert refused(db, user, {"recipe": {"name": "nope"}}).field == "recipe.name"
    assert (
        refused(db, user, {"recipe": {"name": "demo", "params": {"stepz": 1}}}).field == "recipe.params.stepz"
    )
    assert refused(db, user, {"recipe": {"name": "demo", "params": {"steps": "many"}}}).field == (
        "recipe.params.steps"
    )
    assert (
        refused(db, user, {"recipe": {"name": "demo", "params": {"steps": 0}}}).field == "recipe.params.steps"
    )


def test_preview_of_another_user_is_not_visible_but_admin_sees_it(db: Database) -> None:
    alice = add_user(db, "alice")
    bob = add_user(db, "bob")
    admin = add_user(db, "root", "admin")
    one_local_fleet(db)
    preview = service.create_preview(db, alice, DEMO)
    with pytest.raises(Refusal) as err:
        service.get_preview(db, bob, preview["id"])
    assert err.value.status == 404
    assert service.get_preview(db, admin, preview["id"])["id"] == preview["id"]


def test_preview_carries_an_expiry_from_the_settings(db: Database) -> None:
    user = add_user(db, "alice")
    admin = add_user(db, "root", "admin")
    one_local_fleet(db)
    db.call("set_submission_setting", admin, "preview_ttl_seconds", 120)
    preview = service.create_preview(db, user, DEMO)
    assert (preview["expires_at"] - preview["created_at"]).total_seconds() == 120
    assert not preview["expired"]


def test_simulated_gpus_are_called_out(db: Database) -> None:
    user = add_user(db, "alice")
    fleet = add_fleet(db, "sim")
    add_node(db, fleet, "n1", gpus=2, simulated=True)
    preview = service.create_preview(db, user, {**DEMO, "resources": {"gpus_per_node": 1}})
    assert any("simulated" in w for w in preview["resolved"]["warnings"])


def test_canonical_json_function_matches_python_on_awkward_values(db_url: str) -> None:
    value = {"b": [1, 2.5, None, True], "a": {"z": "\u00e9\u2028\x01", "é": 1e20, "A": -0.001}, "": []}
    with psycopg.connect(db_url) as conn:
        text = conn.execute(
            "SELECT tuneplane.canonical_json(%s::jsonb)", (psycopg.types.json.Jsonb(value),)
        ).fetchone()[0]
    assert text == canonical_json(value)
