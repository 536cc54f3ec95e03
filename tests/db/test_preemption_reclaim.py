"""The planner's reclaim rule (docs/preemption.md, "The planner"; docs/teams.md, "Reclaiming a lent
guarantee"), on the real stored functions: a job within its team's guarantee preempts preemptible work of
other teams that runs on GPUs lent above their own guarantee — of equal (or lower) priority, never higher,
only the lender's newest attempts up to what it holds above its guarantee, never a team within its
guarantee — and the victim, queued again, never preempts the reclaimer back."""

from __future__ import annotations

import psycopg
import pytest

from tests.conftest import REPO
from tests.db.test_preemption_planner import asked, run
from tests.launch_fixtures import (
    assert_no_gpu_allocated_twice,
    job,
    make_fleet,
    make_job,
    make_node,
    make_team,
    make_user,
    report,
    set_quota,
)
from tuneplane.app.db import Database


@pytest.fixture
def teams(db: Database) -> dict:
    admin = make_user(db, "root", "admin")
    users = {name: make_user(db, name) for name in ("vic", "nia", "mel")}
    fleet = make_fleet(db, "gpu")
    return {
        "admin": admin,
        "fleet": fleet,
        "users": users,
        "vision": make_team(db, users["vic"], "vision"),
        "nlp": make_team(db, users["nia"], "nlp"),
        "ml": make_team(db, users["mel"], "ml"),
    }


def submit(db: Database, t: dict, team: str, gpus: int, priority: int = 0, preemptible: bool = True) -> int:
    owner = t["users"][{"vision": "vic", "nlp": "nia", "ml": "mel"}[team]]
    return make_job(
        db, owner, t["fleet"], gpus_per_node=gpus, team_id=t[team], priority=priority, preemptible=preemptible
    )


def runbook_reclaimable(db: Database, job_id: int) -> list[dict]:
    """docs/runbook.md's "what job 42's team could reclaim now", run as written for another job."""
    text = (REPO / "docs" / "runbook.md").read_text()
    start = text.index("SELECT l.*, t.job_id")
    query = text[start : text.index(";", start)].replace("q.id = 42", "q.id = %s")
    return db.fetch_all(query, (job_id,))


def decisions(db: Database, fleet: int) -> list[dict]:
    return db.fetch_all("SELECT * FROM preemptions WHERE fleet_id = %s ORDER BY id", (fleet,))


def stop_cause(db: Database, job_id: int) -> str:
    return db.fetch_one(
        "SELECT stop_cause FROM attempts WHERE job_id = %s ORDER BY number DESC LIMIT 1", (job_id,)
    )["stop_cause"]


def test_an_equal_priority_borrower_is_reclaimed_newest_first_and_never_reclaims_back(
    db: Database, teams: dict
) -> None:
    t, fleet = teams, teams["fleet"]
    make_node(db, fleet, "n1", gpus=4)
    n2 = make_node(db, fleet, "n2", gpus=4)
    set_quota(db, t["admin"], t["vision"], fleet, guaranteed=4)
    set_quota(db, t["admin"], t["nlp"], fleet, guaranteed=4)
    # nlp fills the idle fleet: 4 GPUs within its guarantee, 4 borrowed from vision's unused guarantee. The
    # oldest attempt loses the least work, but it is inside nlp's own guarantee: only the two newest are lent.
    oldest = submit(db, t, "nlp", 2)
    run(db, fleet, oldest, ran_for=600)
    second = submit(db, t, "nlp", 2)
    run(db, fleet, second, ran_for=600)
    third = submit(db, t, "nlp", 2)
    run(db, fleet, third, ran_for=7200)
    newest = submit(db, t, "nlp", 2)
    member = run(db, fleet, newest, ran_for=3600)
    assert member["node_id"] == n2

    reclaimer = submit(db, t, "vision", 2, preemptible=False)
    assert sorted(r["job_id"] for r in runbook_reclaimable(db, reclaimer)) == [third, newest]
    db.call("reserve_next", fleet, 1000)
    assert asked(db, newest)
    assert not any(asked(db, j) for j in (oldest, second, third))
    (decision,) = decisions(db, fleet)
    assert decision["rule"] == "reclaim" and decision["held_node_ids"] == [n2]
    assert decision["numbers"]["reclaim"] == {
        "team_id": t["vision"],
        "team": "vision",
        "held": 0,
        "guaranteed": 4,
        "asks": 2,
        "lenders": [
            {"team_id": t["nlp"], "team": "nlp", "held": 8, "guaranteed": 4, "reclaimed": 2, "jobs": [newest]}
        ],
    }
    words = (
        "team vision reclaims 2 of its 4 guaranteed GPUs lent to team nlp (team vision holds 0 and this job "
        "asks 2; team nlp holds 8, 4 above its guarantee of 4)"
    )
    assert words in job(db, reclaimer)["state_reason"]
    assert "(rule reclaim;" in job(db, reclaimer)["state_reason"]
    assert words in decision["reason"]
    assert stop_cause(db, newest) == words
    event = db.fetch_one(
        "SELECT reason FROM job_events WHERE job_id = %s AND detail ->> 'kind' = 'stop_request'", (newest,)
    )
    assert f"preempted by job {reclaimer} ({words})" in event["reason"]

    # The victim stops; the reclaimer takes the held node; the victim, queued again, waits: its team holds 6
    # (above its guarantee of 4), so it cannot reclaim, and equal priority never preempts.
    report(db, "member_exited", member, exit_code=0)
    placed = {r["job_id"] for r in db.call("reserve_next", fleet, 1000)}
    assert placed == {reclaimer}
    assert db.fetch_one("SELECT state FROM preemptions WHERE id = %s", (decision["id"],))["state"] == "done"
    assert job(db, newest)["state"] == "queued"
    for _ in range(3):
        db.call("reserve_next", fleet, 1000)
    assert len(decisions(db, fleet)) == 1
    assert not asked(db, reclaimer)
    assert "within its guarantee" not in job(db, newest)["state_reason"]
    assert_no_gpu_allocated_twice(db)


def test_no_loop_when_the_victim_falls_back_to_its_guarantee(db: Database, teams: dict) -> None:
    """Both teams guaranteed 2 of 4: after the reclaim each holds exactly its guarantee; the victim's job
    would go past nlp's guarantee, so nobody reclaims again."""
    t, fleet = teams, teams["fleet"]
    make_node(db, fleet, "n1", gpus=4)
    set_quota(db, t["admin"], t["vision"], fleet, guaranteed=2)
    set_quota(db, t["admin"], t["nlp"], fleet, guaranteed=2)
    kept = submit(db, t, "nlp", 2)
    run(db, fleet, kept)
    lent = submit(db, t, "nlp", 2)
    member = run(db, fleet, lent)
    reclaimer = submit(db, t, "vision", 2)
    db.call("reserve_next", fleet, 1000)
    assert asked(db, lent) and not asked(db, kept)
    report(db, "member_exited", member, exit_code=0)
    db.call("reserve_next", fleet, 1000)
    run_member = db.fetch_one("SELECT state FROM jobs WHERE id = %s", (reclaimer,))
    assert run_member["state"] == "reserved"
    for _ in range(3):
        db.call("reserve_next", fleet, 1000)
    assert [d["rule"] for d in decisions(db, fleet)] == ["reclaim"]
    assert job(db, lent)["state"] == "queued" and not asked(db, reclaimer)


def test_a_borrower_of_higher_priority_is_not_reclaimed(db: Database, teams: dict) -> None:
    t, fleet = teams, teams["fleet"]
    make_node(db, fleet, "n1", gpus=4)
    set_quota(db, t["admin"], t["vision"], fleet, guaranteed=4)
    borrower = submit(db, t, "nlp", 4, priority=50)
    run(db, fleet, borrower)
    waiting = submit(db, t, "vision", 2, priority=0)
    db.call("reserve_next", fleet, 1000)
    assert not asked(db, borrower)
    assert decisions(db, fleet) == []
    assert "reclaims" not in job(db, waiting)["state_reason"]
    assert "within its guarantee" in job(db, waiting)["state_reason"]


def test_a_lower_priority_borrower_is_taken_back_under_the_reclaim_rule(db: Database, teams: dict) -> None:
    t, fleet = teams, teams["fleet"]
    make_node(db, fleet, "n1", gpus=4)
    set_quota(db, t["admin"], t["vision"], fleet, guaranteed=4)
    borrower = submit(db, t, "nlp", 4, priority=-10)
    run(db, fleet, borrower)
    submit(db, t, "vision", 1, priority=0)
    db.call("reserve_next", fleet, 1000)
    assert asked(db, borrower)
    assert [d["rule"] for d in decisions(db, fleet)] == ["reclaim"]
    assert stop_cause(db, borrower).startswith(
        "team vision reclaims 4 of its 4 guaranteed GPUs lent to team nlp"
    )


def test_a_job_that_would_go_past_its_guarantee_does_not_reclaim(db: Database, teams: dict) -> None:
    t, fleet = teams, teams["fleet"]
    make_node(db, fleet, "n1", gpus=4)
    make_node(db, fleet, "n2", gpus=4)
    set_quota(db, t["admin"], t["vision"], fleet, guaranteed=4)
    mine = submit(db, t, "vision", 2)
    run(db, fleet, mine)
    borrowers = [submit(db, t, "nlp", 2) for _ in range(3)]
    for b in borrowers:
        run(db, fleet, b)
    # vision holds 2 of 4; a 4-GPU job would take it to 6: it is no longer within its guarantee.
    past = submit(db, t, "vision", 4, preemptible=True)
    non_preemptible = submit(db, t, "vision", 4, preemptible=False)
    db.call("reserve_next", fleet, 1000)
    assert decisions(db, fleet) == []
    assert not any(asked(db, b) for b in borrowers)
    assert "would go past its 4 guaranteed GPUs" in job(db, non_preemptible)["state_reason"]
    assert "reclaims" not in job(db, past)["state_reason"]


def test_a_team_within_its_guarantee_is_never_a_reclaim_victim(db: Database, teams: dict) -> None:
    t, fleet = teams, teams["fleet"]
    make_node(db, fleet, "n1", gpus=4)
    make_node(db, fleet, "n2", gpus=4)
    set_quota(db, t["admin"], t["vision"], fleet, guaranteed=4)
    set_quota(db, t["admin"], t["nlp"], fleet, guaranteed=4)
    # nlp runs within its guarantee and would lose the least work; ml only borrows.
    nlp_jobs = [submit(db, t, "nlp", 2) for _ in range(2)]
    for j in nlp_jobs:
        run(db, fleet, j, ran_for=600)
    ml_jobs = [submit(db, t, "ml", 2) for _ in range(2)]
    for j in ml_jobs:
        run(db, fleet, j, ran_for=7200)
    submit(db, t, "vision", 2)
    db.call("reserve_next", fleet, 1000)
    (decision,) = decisions(db, fleet)
    assert decision["rule"] == "reclaim"
    assert [lender["team"] for lender in decision["numbers"]["reclaim"]["lenders"]] == ["ml"]
    assert sum(asked(db, j) for j in ml_jobs) == 1
    assert not any(asked(db, j) for j in nlp_jobs)


def test_an_overcommitted_guarantee_takes_nothing_from_a_team_within_its_own(
    db: Database, teams: dict
) -> None:
    t, fleet = teams, teams["fleet"]
    make_node(db, fleet, "n1", gpus=4)
    set_quota(db, t["admin"], t["vision"], fleet, guaranteed=4)
    set_quota(db, t["admin"], t["nlp"], fleet, guaranteed=4, overcommit=True)
    inside = submit(db, t, "nlp", 4)
    run(db, fleet, inside)
    waiting = submit(db, t, "vision", 2)
    db.call("reserve_next", fleet, 1000)
    assert decisions(db, fleet) == [] and not asked(db, inside)
    assert "within its guarantee" in job(db, waiting)["state_reason"]


def test_a_job_within_its_guarantee_reclaims_even_after_its_shape_failed_earlier_in_the_pass(
    db: Database, teams: dict
) -> None:
    """The planner runs once per request shape and pass, but a reclaim depends on the job's team and
    priority: a borrower of the same shape searched first (it plans nothing) must not stop the reclaimer."""
    t, fleet = teams, teams["fleet"]
    make_node(db, fleet, "n1", gpus=4)
    make_node(db, fleet, "n2", gpus=4)
    set_quota(db, t["admin"], t["vision"], fleet, guaranteed=4)
    set_quota(db, t["admin"], t["nlp"], fleet, guaranteed=0, weight=10)
    lent = []
    for _ in range(2):  # 3 GPUs on each node, one free on each
        lent.append(submit(db, t, "nlp", 3))
        run(db, fleet, lent[-1])
    # Admission order: vision's big job (refused: too little idle to borrow), nlp's 2-GPU borrower (fair
    # share 6 / 10: admitted, searched, no node has 2 free GPUs), then vision's 2-GPU job, within its
    # guarantee but behind 6 queued GPUs of its own team: the same shape, already searched in this pass.
    big = submit(db, t, "vision", 6, priority=10)
    borrower = submit(db, t, "nlp", 2)
    within = submit(db, t, "vision", 2)
    order = [
        r["job_id"] for r in db.fetch_all("SELECT job_id FROM admission_queue(%s) ORDER BY ord", (fleet,))
    ]
    assert order == [big, borrower, within]
    db.call("reserve_next", fleet, 1000)
    assert "waiting for resources" in job(db, borrower)["state_reason"]
    (decision,) = decisions(db, fleet)
    assert decision["preemptor_job_id"] == within and decision["rule"] == "reclaim"
    assert "preempting" not in job(db, borrower)["state_reason"]


def test_on_a_fleet_with_quotas_a_backing_off_job_says_its_team_numbers(db: Database, teams: dict) -> None:
    t, fleet = teams, teams["fleet"]
    make_node(db, fleet, "n1", gpus=4)
    set_quota(db, t["admin"], t["nlp"], fleet, guaranteed=8, overcommit=True)
    victim = submit(db, t, "nlp", 1)
    member = run(db, fleet, victim)
    run(db, fleet, submit(db, t, "nlp", 2, preemptible=False))
    make_node(db, fleet, "n2", gpus=1)  # room for the victim alone, not for the urgent job
    urgent = submit(db, t, "nlp", 2, priority=100, preemptible=False)
    db.call("reserve_next", fleet, 1000)
    assert asked(db, victim)
    report(db, "member_exited", member, exit_code=0)
    with psycopg.connect(db.url, autocommit=False) as other:  # the urgent job is skipped in this pass
        other.execute("SELECT 1 FROM tuneplane.jobs WHERE id = %s FOR UPDATE", (urgent,))
        db.call("reserve_next", fleet, 1000)
        other.rollback()
    reason = job(db, victim)["state_reason"]
    assert "backing off until" in reason, reason
    assert reason.endswith(
        "; within its guarantee: team nlp on fleet gpu: 8 guaranteed GPUs, limit none, weight 1"
    )
