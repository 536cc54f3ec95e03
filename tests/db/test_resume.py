"""Resume from the last verified checkpoint (docs/preemption.md): every later attempt of a job is told, in
PREPARE, the job's newest complete checkpoint, the node may read it while it holds the member, retention
keeps it, and a job can turn resuming off or pin one checkpoint."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from psycopg.types.json import Jsonb

from tests.artifact_fixtures import (
    MemberSetup,
    give_credential,
    make_fleet_with,
    recorded_complete,
    write_tree,
)
from tests.launch_fixtures import make_job, make_node, make_user, members_of, report, run_to_running
from tuneplane.app.db import Database
from tuneplane.app.errors import Refusal


def execute(db: Database, query: str, params: tuple = ()) -> None:
    with db.transaction() as conn:
        conn.execute(query, params)


def setup_job(db: Database, max_attempts: int = 3) -> MemberSetup:
    user_id = make_user(db)
    fleet_id = make_fleet_with(db, "gpu", {"object_delivery": True})
    node_id = make_node(db, fleet_id, "gpu-node", gpus=2)
    credential, credential_hash = give_credential(db, node_id)
    job_id = make_job(db, user_id, fleet_id, max_attempts=max_attempts)
    db.call("reserve_next", fleet_id, 1000)
    member = run_to_running(db, job_id)[0]
    return MemberSetup(user_id, fleet_id, node_id, job_id, member, credential, credential_hash)


def checkpoint(
    db: Database, setup: MemberSetup, tmp_path: Path, name: str, body: bytes, step: int | None = None
) -> dict:
    manifest = write_tree(tmp_path / name, {"model.npz": body})
    return recorded_complete(db, setup, name, manifest, kind="checkpoint", step=step)


def fail_and_prepare_again(db: Database, setup: MemberSetup) -> dict:
    """The running attempt fails; the retry is placed and prepared; returns its PREPARE payload."""
    report(db, "member_exited", members_of(db, setup.job_id)[-1], exit_code=1)
    db.call("reserve_next", setup.fleet_id, 1000)
    run_to_running(db, setup.job_id)
    row = db.fetch_one(
        "SELECT payload FROM node_commands WHERE kind = 'prepare' AND node_id = %s ORDER BY id DESC LIMIT 1",
        (setup.node_id,),
    )
    return row["payload"]


def test_a_retry_resumes_from_the_newest_complete_checkpoint(db: Database, tmp_path: Path) -> None:
    setup = setup_job(db)
    first = db.fetch_one("SELECT payload FROM node_commands WHERE kind = 'prepare'")["payload"]
    assert first["resume"] is None  # attempt 1: nothing to resume from
    checkpoint(db, setup, tmp_path, "checkpoint.1", b"one")
    newest = checkpoint(db, setup, tmp_path, "checkpoint.2", b"two")
    # A later checkpoint still uploading is never resumed from: only server-verified bytes are.
    manifest = write_tree(tmp_path / "checkpoint.3", {"model.npz": b"three"})
    db.call(
        "register_artifact", setup.credential_hash, setup.member["id"], "checkpoint.3", "checkpoint",
        "object", Jsonb(manifest.as_json()), manifest.digest, None,
    )  # fmt: skip
    payload = fail_and_prepare_again(db, setup)
    assert payload["resume"]["artifact_id"] == newest["id"]
    assert payload["resume"]["name"] == "checkpoint.2"
    assert payload["resume"]["manifest_digest"] == newest["manifest_digest"]
    attempt = db.fetch_one("SELECT * FROM attempts WHERE job_id = %s AND number = 2", (setup.job_id,))
    assert attempt["resume_artifact_id"] == newest["id"]
    reasons = [
        r["reason"] for r in db.fetch_all("SELECT reason FROM job_events WHERE job_id = %s", (setup.job_id,))
    ]
    assert any("attempt 2: preparing" in r and "resumes from checkpoint.2" in r for r in reasons), reasons


def test_the_node_of_the_retry_may_read_the_checkpoint_and_no_other_node_may(
    db: Database, tmp_path: Path
) -> None:
    setup = setup_job(db)
    ckpt = checkpoint(db, setup, tmp_path, "checkpoint.1", b"one")
    fail_and_prepare_again(db, setup)
    got = db.call("artifact_input_for_node", setup.credential_hash, ckpt["id"])[0]
    assert got["id"] == ckpt["id"]
    other = make_node(db, setup.fleet_id, "other-node", gpus=2)
    _, other_hash = give_credential(db, other)
    with pytest.raises(Refusal) as refused:
        db.call("artifact_input_for_node", other_hash, ckpt["id"])
    assert refused.value.status == 404


def test_retention_never_prunes_the_checkpoint_a_live_attempt_resumes_from(
    db: Database, tmp_path: Path
) -> None:
    execute(db, "UPDATE artifact_settings SET keep_checkpoints = 1")
    setup = setup_job(db)
    first = checkpoint(db, setup, tmp_path, "checkpoint.1", b"one")
    fail_and_prepare_again(db, setup)
    checkpoint(db, setup, tmp_path, "checkpoint.2", b"two")  # completes: prunes older ones
    db.call("prune_checkpoints", setup.job_id)
    assert db.fetch_one("SELECT state FROM artifacts WHERE id = %s", (first["id"],))["state"] == "complete"


def test_resume_none_starts_every_attempt_from_scratch(db: Database, tmp_path: Path) -> None:
    setup = setup_job(db)
    execute(
        db,
        "UPDATE jobs SET spec = spec || %s WHERE id = %s",
        (Jsonb({"resume": {"mode": "none"}}), setup.job_id),
    )
    checkpoint(db, setup, tmp_path, "checkpoint.1", b"one")
    assert fail_and_prepare_again(db, setup)["resume"] is None


def test_a_pinned_checkpoint_is_resumed_from_on_every_attempt(db: Database, tmp_path: Path) -> None:
    setup = setup_job(db)
    pinned = checkpoint(db, setup, tmp_path, "checkpoint.1", b"one")
    resume = db.call("resolve_resume", setup.user_id, Jsonb(f"{setup.job_id}/checkpoint.1"))[0][
        "resolve_resume"
    ]
    assert resume["mode"] == "pinned" and resume["artifact_id"] == pinned["id"]
    execute(db, "UPDATE jobs SET spec = spec || %s WHERE id = %s", (Jsonb({"resume": resume}), setup.job_id))
    checkpoint(db, setup, tmp_path, "checkpoint.2", b"two")
    assert fail_and_prepare_again(db, setup)["resume"]["artifact_id"] == pinned["id"]


@pytest.mark.parametrize(
    ("value", "status"),
    [(7, 422), ("", 422), ("999/checkpoint.1", 404), ("not a ref", 422)],
)
def test_a_bad_resume_value_is_refused_naming_the_field(db: Database, value, status: int) -> None:
    user_id = make_user(db)
    with pytest.raises(Refusal) as refused:
        db.call("resolve_resume", user_id, Jsonb(value))
    assert refused.value.status == status
    assert refused.value.field == "resume"


def test_latest_and_none_resolve_without_an_artifact(db: Database) -> None:
    user_id = make_user(db)
    assert db.call("resolve_resume", user_id, None)[0]["resolve_resume"] == {"mode": "latest"}
    assert db.call("resolve_resume", user_id, Jsonb("none"))[0]["resolve_resume"] == {"mode": "none"}
    assert json.loads(
        json.dumps(db.call("resolve_resume", user_id, Jsonb("latest"))[0]["resolve_resume"])
    ) == {"mode": "latest"}


# Issue 35: a corrupt newest checkpoint is marked, named in the timeline and never resumed from again.


def _events(db: Database, job_id: int) -> list[str]:
    return [r["reason"] for r in db.fetch_all("SELECT reason FROM job_events WHERE job_id = %s ORDER BY id",
                                              (job_id,))]  # fmt: skip


def test_a_checkpoint_a_verification_found_corrupt_is_never_resumed_from(
    db: Database, tmp_path: Path
) -> None:
    setup = setup_job(db)
    older = checkpoint(db, setup, tmp_path, "checkpoint.1", b"one")
    newest = checkpoint(db, setup, tmp_path, "checkpoint.2", b"two")
    db.call(
        "record_artifact_verification", setup.user_id, newest["id"], False, 1,
        Jsonb(["model.npz: sha256 differs from the manifest"]),
    )  # fmt: skip
    assert db.fetch_one("SELECT * FROM artifact_corruptions WHERE artifact_id = %s", (newest["id"],))
    assert any(
        "checkpoint checkpoint.2 of attempt 1 is corrupt (found by a verification by user:alice: model.npz"
        in r
        and "never resumed from again" in r
        for r in _events(db, setup.job_id)
    ), _events(db, setup.job_id)
    payload = fail_and_prepare_again(db, setup)
    assert payload["resume"]["artifact_id"] == older["id"]
    # Marked once: a second finding changes nothing and says nothing more.
    again = db.call("mark_artifact_corrupt", newest["id"], "again", "test")[0]
    assert again["mark_artifact_corrupt"] is False
    assert sum("is corrupt" in r for r in _events(db, setup.job_id)) == 1


def test_an_attempt_whose_checkpoint_is_found_corrupt_while_preparing_falls_back_without_spending_one(
    db: Database, tmp_path: Path
) -> None:
    """The node gateway finds the stored bytes of the checkpoint it serves to the preparing node corrupt:
    the prepare fails, and the job is queued again from the previous checkpoint, counting against neither
    max_attempts nor the free re-launches."""
    execute(db, "UPDATE launch_settings SET free_relaunches = 0")
    setup = setup_job(db, max_attempts=2)
    older = checkpoint(db, setup, tmp_path, "checkpoint.1", b"one", step=100)
    newest = checkpoint(db, setup, tmp_path, "checkpoint.2", b"two")
    report(db, "member_exited", members_of(db, setup.job_id)[-1], exit_code=1)  # attempt 1 of 2 failed
    db.call("reserve_next", setup.fleet_id, 1000)
    attempt = db.fetch_one("SELECT * FROM attempts WHERE job_id = %s AND number = 2", (setup.job_id,))
    epoch = db.call("claim_launch", attempt["id"], "w")[0]["epoch"]
    db.call("begin_prepare", attempt["id"], epoch, "a" * 64)
    assert (
        db.fetch_one("SELECT resume_artifact_id FROM attempts WHERE id = %s", (attempt["id"],))[
            "resume_artifact_id"
        ]
        == newest["id"]
    )
    # What the gateway does when its hash of the stored bytes differs (app/artifacts/gateway_routes.py).
    db.call("mark_artifact_corrupt", newest["id"], "model.npz: the stored bytes do not match the manifest",
            "the node gateway serving it to a node")  # fmt: skip
    (m,) = [m for m in members_of(db, setup.job_id) if m["attempt_id"] == attempt["id"]]
    report(db, "member_prepare_failed", m, reason="input resume (checkpoint.2): transfer failed")
    j = db.fetch_one("SELECT * FROM jobs WHERE id = %s", (setup.job_id,))
    assert j["state"] == "queued", j
    assert (
        "its checkpoint checkpoint.2 is corrupt, so it does not count against max_attempts"
        in j["state_reason"]
    ), j["state_reason"]
    assert "launching again as attempt 3 from checkpoint.1 (step 100)" in j["state_reason"]
    assert j["corrupt_resumes_used"] == 1 and j["free_relaunches_used"] == 0
    db.call("reserve_next", setup.fleet_id, 1000)
    run_to_running(db, setup.job_id)
    third = db.fetch_one("SELECT * FROM attempts WHERE job_id = %s AND number = 3", (setup.job_id,))
    assert third["resume_artifact_id"] == older["id"]
    (m3,) = [m for m in members_of(db, setup.job_id) if m["attempt_id"] == third["id"]]
    report(db, "member_exited", m3, exit_code=0)
    assert db.fetch_one("SELECT state FROM jobs WHERE id = %s", (setup.job_id,))["state"] == "succeeded"


def test_a_pinned_checkpoint_found_corrupt_is_still_the_one_asked_for(db: Database, tmp_path: Path) -> None:
    # The job asked for exactly it: its prepare fails naming it, it does not silently start elsewhere.
    setup = setup_job(db)
    pinned = checkpoint(db, setup, tmp_path, "checkpoint.1", b"one")
    resume = db.call("resolve_resume", setup.user_id, Jsonb(f"{setup.job_id}/checkpoint.1"))[0][
        "resolve_resume"
    ]
    execute(db, "UPDATE jobs SET spec = spec || %s WHERE id = %s", (Jsonb({"resume": resume}), setup.job_id))
    db.call("mark_artifact_corrupt", pinned["id"], "bad", "test")
    assert fail_and_prepare_again(db, setup)["resume"]["artifact_id"] == pinned["id"]


def test_prepare_tells_each_member_the_checkpoint_numbers_the_job_reached(
    db: Database, tmp_path: Path
) -> None:
    """Issue 35: checkpoint names are numbered on across attempts, so a name means one artifact of the job's
    rank (attempt 2 publishes checkpoint.3 after attempt 1's checkpoint.2, not checkpoint.1 again)."""
    setup = setup_job(db)
    first = db.fetch_one("SELECT payload FROM node_commands WHERE kind = 'prepare'")["payload"]
    assert first["checkpoint_numbers"] == {}
    checkpoint(db, setup, tmp_path, "checkpoint.1", b"one")
    checkpoint(db, setup, tmp_path, "checkpoint.2", b"two")
    checkpoint(db, setup, tmp_path, "best.7", b"best")
    assert fail_and_prepare_again(db, setup)["checkpoint_numbers"] == {"checkpoint": 2, "best": 7}


def test_migration_0281_marks_what_a_past_verification_found_corrupt(db: Database, tmp_path: Path) -> None:
    setup = setup_job(db)
    bad = checkpoint(db, setup, tmp_path, "checkpoint.1", b"one")
    good = checkpoint(db, setup, tmp_path, "checkpoint.2", b"two")
    # Verifications recorded before 0280 (no mark then): bad's latest failed, good's latest passed.
    for artifact, ok in ((bad, False), (good, False), (good, True)):
        execute(
            db,
            "INSERT INTO artifact_verifications (artifact_id, ok, problems, requested_by)"
            " VALUES (%s, %s, %s, 'user:x')",
            (artifact["id"], ok, Jsonb([] if ok else ["model.npz: sha256 differs"])),
        )
    migration = (
        Path(__file__).parents[2] / "sql" / "migrations" / "0281_corruptions_from_past_verifications.sql"
    )
    execute(db, migration.read_text())
    marked = db.fetch_all("SELECT artifact_id, reason, found_by FROM artifact_corruptions")
    assert marked == [
        {
            "artifact_id": bad["id"],
            "reason": "model.npz: sha256 differs",
            "found_by": "a verification by user:x",
        }
    ]
