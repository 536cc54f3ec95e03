"""Admission by team quotas in reserve_next (docs/teams.md, ADR 0170), on the real stored functions.

The fairness test runs a simulated clock over real placement passes: a job "runs" from its placement
until its simulated end, when it is cancelled (cancel_job releases its GPUs as a finished member would).
"""

from __future__ import annotations

import heapq
import random

import pytest

from tests.launch_fixtures import job, make_fleet, make_job, make_node, make_team, make_user, set_quota
from tuneplane.app.db import Database
from tuneplane.app.errors import Refusal


def _placed(db: Database, fleet: int) -> list[int]:
    # The nodes' agents are simulated: they heartbeat before every pass (a slow run must not make them stale).
    db.fetch_all("UPDATE nodes SET last_heartbeat_at = now() WHERE fleet_id = %s RETURNING id", (fleet,))
    return [r["job_id"] for r in db.call("reserve_next", fleet, 1000)]


def _held(db: Database, team: int) -> int:
    return db.fetch_one(
        """SELECT coalesce(sum(cardinality(m.gpu_indices)), 0)::int AS n FROM members m
             JOIN jobs j ON j.id = m.job_id WHERE m.released_at IS NULL AND j.team_id = %s""",
        (team,),
    )["n"]


@pytest.fixture
def shared_fleet(db: Database) -> dict:
    admin = make_user(db, "root", "admin")
    fleet = make_fleet(db, "gpu")
    make_node(db, fleet, "n1", gpus=8)
    make_node(db, fleet, "n2", gpus=8)
    return {"admin": admin, "fleet": fleet}


def test_weights_1_and_3_share_a_full_fleet_1_to_3_and_a_late_guarantee_is_served_first(
    db: Database, shared_fleet: dict
) -> None:
    admin, fleet = shared_fleet["admin"], shared_fleet["fleet"]
    rng = random.Random(20)
    users = {name: make_user(db, name) for name in ("ann", "bob", "cyd")}
    teams = {
        name: make_team(db, users[u], name) for name, u in (("small", "ann"), ("big", "bob"), ("late", "cyd"))
    }
    set_quota(db, admin, teams["small"], fleet, guaranteed=0, weight=1)
    set_quota(db, admin, teams["big"], fleet, guaranteed=0, weight=3)
    owner = {teams["small"]: users["ann"], teams["big"]: users["bob"], teams["late"]: users["cyd"]}
    team_of: dict[int, int] = {}

    def submit(team: int, preemptible: bool = True) -> int:
        j = make_job(db, owner[team], fleet, gpus_per_node=1, team_id=team, preemptible=preemptible)
        team_of[j] = team
        return j

    for _ in range(24):  # both teams keep far more queued than the fleet holds
        submit(teams["small"])
        submit(teams["big"])
    now = 0.0
    running: list[tuple[float, int]] = []  # (simulated end, job)
    gpu_seconds = {teams["small"]: 0.0, teams["big"]: 0.0}
    placements = 0
    while placements < 500:
        for j in _placed(db, fleet):
            placements += 1
            heapq.heappush(running, (now + rng.uniform(1, 10), j))
            submit(team_of[j])  # keep the queue full
        assert len(running) == 16  # the fleet stays full
        end, j = heapq.heappop(running)
        for _end, r in running:  # GPU-seconds of the interval (now, end]
            gpu_seconds[team_of[r]] += end - now
        gpu_seconds[team_of[j]] += end - now
        now = end
        db.call("cancel_job", j, admin, "simulated end")
    ratio = gpu_seconds[teams["big"]] / gpu_seconds[teams["small"]]
    assert 3 * 0.9 <= ratio <= 3 * 1.1, gpu_seconds

    for j in _placed(db, fleet):  # the GPU the last end gave back
        heapq.heappush(running, (now + rng.uniform(1, 10), j))
    # A third team with a guarantee of 4 submits late: each GPU that borrowers give back goes to it first.
    set_quota(db, admin, teams["late"], fleet, guaranteed=4, weight=1)
    late = [submit(teams["late"], preemptible=False) for _ in range(6)]
    assert _placed(db, fleet) == []  # the fleet is full; nothing is taken back (no preemption yet)
    assert (
        "within its guarantee: team late on fleet gpu: 4 guaranteed GPUs" in job(db, late[0])["state_reason"]
    )
    now = db.call("team_waiting_now", late[0])[0]["team_waiting_now"]
    assert now.startswith("team late uses 0 of its 4 guaranteed GPUs on fleet gpu (limit none, weight 1)"), (
        now
    )
    assert "fair share: team late holds 0 GPUs at weight 1, team big holds 12 GPUs at weight 3" in now, now
    for expected in range(1, 5):
        _end, j = heapq.heappop(running)
        db.call("cancel_job", j, admin, "simulated end")
        placed = _placed(db, fleet)
        assert [team_of[p] for p in placed] == [teams["late"]], f"GPU {expected} went to {placed}"
        assert _held(db, teams["late"]) == expected
    # At its guarantee, the late team's non-preemptible jobs wait with the numbers; borrowers get the GPU.
    _end, j = heapq.heappop(running)
    db.call("cancel_job", j, admin, "simulated end")
    placed = _placed(db, fleet)
    assert len(placed) == 1 and team_of[placed[0]] != teams["late"]
    assert job(db, late[4])["state_reason"] == (
        "team late would go past its 4 guaranteed GPUs on fleet gpu; this job asks 1; "
        "it can borrow idle GPUs if it is preemptible"
    )


def test_a_team_never_goes_past_its_limit_and_the_reason_says_the_numbers(
    db: Database, shared_fleet: dict
) -> None:
    admin, fleet = shared_fleet["admin"], shared_fleet["fleet"]
    user = make_user(db, "vera")
    vision = make_team(db, user, "vision")
    set_quota(db, admin, vision, fleet, guaranteed=2, limit=5, weight=1)
    jobs = [make_job(db, user, fleet, gpus_per_node=2, team_id=vision, preemptible=True) for _ in range(3)]
    assert sorted(_placed(db, fleet)) == jobs[:2]  # 2 within the guarantee, 2 borrowed: 4 of 5
    assert job(db, jobs[2])["state_reason"] == (
        "team vision would go past its limit of 5 GPUs on fleet gpu; this job asks 2"
    )
    borrowed = db.fetch_all(
        "SELECT job_id, borrowing FROM attempts WHERE job_id = ANY(%s) ORDER BY job_id", (jobs,)
    )
    assert [b["borrowing"] for b in borrowed] == [False, True]


def test_a_non_preemptible_job_above_the_guarantee_waits_even_on_an_idle_fleet(
    db: Database, shared_fleet: dict
) -> None:
    admin, fleet = shared_fleet["admin"], shared_fleet["fleet"]
    user = make_user(db, "vera")
    vision = make_team(db, user, "vision")
    set_quota(db, admin, vision, fleet, guaranteed=8, weight=1)
    first = make_job(db, user, fleet, gpus_per_node=6, team_id=vision)
    second = make_job(db, user, fleet, gpus_per_node=4, team_id=vision)
    assert _placed(db, fleet) == [first]
    assert job(db, second)["state_reason"] == (
        "team vision would go past its 8 guaranteed GPUs on fleet gpu; this job asks 4; "
        "it can borrow idle GPUs if it is preemptible"
    )
    assert db.call("team_waiting_now", second)[0]["team_waiting_now"].startswith(
        "team vision uses 6 of its 8 guaranteed GPUs on fleet gpu (limit none, weight 1); this job asks 4"
    )


def test_a_fleet_without_quotas_admits_every_team_in_plain_queue_order(
    db: Database, shared_fleet: dict
) -> None:
    fleet = shared_fleet["fleet"]
    user = make_user(db, "vera")
    jobs = [make_job(db, user, fleet, gpus_per_node=8) for _ in range(3)]
    assert _placed(db, fleet) == jobs[:2]
    assert "waiting for resources" in job(db, jobs[2])["state_reason"]
    assert "team" not in job(db, jobs[2])["state_reason"]


def test_guarantees_past_the_fleet_are_refused_with_the_numbers_unless_overcommitted(
    db: Database, shared_fleet: dict
) -> None:
    admin, fleet = shared_fleet["admin"], shared_fleet["fleet"]
    a = make_team(db, admin, "nlp")
    b = make_team(db, admin, "vision")
    set_quota(db, admin, a, fleet, guaranteed=10)
    with pytest.raises(Refusal) as refused:
        set_quota(db, admin, b, fleet, guaranteed=8)
    assert refused.value.status == 409 and refused.value.field == "guaranteed_gpus"
    assert "would sum to 18 GPUs (nlp 10, vision 8), but the fleet has 16 schedulable GPUs" in str(
        refused.value
    )
    assert db.fetch_one("SELECT count(*) AS n FROM team_quotas WHERE team_id = %s", (b,))["n"] == 0
    row = set_quota(db, admin, b, fleet, guaranteed=8, overcommit=True)
    assert row["overcommit"] is True
    user = make_user(db, "mallory")
    with pytest.raises(Refusal) as refused:
        set_quota(db, user, b, fleet, guaranteed=1)
    assert refused.value.status == 403


def test_a_borrower_never_takes_the_gpus_a_waiting_guarantee_is_owed(
    db: Database, shared_fleet: dict
) -> None:
    admin, fleet = shared_fleet["admin"], shared_fleet["fleet"]
    user = make_user(db, "vera")
    owed = make_team(db, user, "owed")
    other = make_team(db, user, "other")
    set_quota(db, admin, owed, fleet, guaranteed=8)
    set_quota(db, admin, other, fleet, guaranteed=0)
    # 12 GPUs busy with borrowers; 4 free on n2. The owed team's 8-GPU job cannot fit a node: it waits,
    # and the 4 free GPUs (of the 8 it is owed) are not lent to the other team.
    busy = [make_job(db, user, fleet, gpus_per_node=4, team_id=other, preemptible=True) for _ in range(3)]
    assert sorted(_placed(db, fleet)) == busy
    waiting = make_job(db, user, fleet, gpus_per_node=8, team_id=owed)
    borrower = make_job(db, user, fleet, gpus_per_node=1, team_id=other, preemptible=True)
    assert _placed(db, fleet) == []
    assert "held for teams waiting within their guarantee" in job(db, borrower)["state_reason"]
    assert (
        "within its guarantee: team owed on fleet gpu: 8 guaranteed GPUs" in job(db, waiting)["state_reason"]
    )


def test_with_a_half_life_a_team_that_held_much_recently_waits_behind_one_that_did_not(
    db: Database, shared_fleet: dict
) -> None:
    admin, fleet = shared_fleet["admin"], shared_fleet["fleet"]
    user = make_user(db, "vera")
    heavy, light = make_team(db, user, "heavy"), make_team(db, user, "light")
    for team in (heavy, light):
        set_quota(db, admin, team, fleet, guaranteed=0, weight=1)
    db.fetch_all("UPDATE fleets SET usage_half_life = interval '1 hour' WHERE id = %s RETURNING id", (fleet,))
    # heavy held 16 GPUs on average lately (as if for a long time); light nothing. Both hold nothing now.
    db.fetch_all(
        """INSERT INTO team_fleet_usage (fleet_id, team_id, decayed_gpu_secs, decayed_at)
           VALUES (%s, %s, 16 * 3600 / ln(2), now()) RETURNING 1""",
        (fleet, heavy),
    )
    first = make_job(db, user, fleet, gpus_per_node=8, nodes=2, team_id=heavy, preemptible=True)
    second = make_job(db, user, fleet, gpus_per_node=8, nodes=2, team_id=light, preemptible=True)
    assert _placed(db, fleet) == [second]  # older, but its team's decayed share is 16 against 0
    assert job(db, first)["state"] == "queued"
    usage = db.fetch_all(
        "SELECT team_id, decayed_gpu_secs FROM team_fleet_usage WHERE fleet_id = %s", (fleet,)
    )
    assert {u["team_id"] for u in usage} == {heavy, light}  # the pass brought every team's usage up to now


def test_a_cpu_only_job_waiting_on_a_fleet_with_quotas_is_told_of_cpus_and_memory_not_gpu_quotas(
    db: Database, shared_fleet: dict
) -> None:
    """GPU quotas do not apply to a job that asks no GPU (admission_verdict admits it): its stored reason,
    and what the job page adds when read (the team's figures, the best fit now), speak of its CPUs and
    memory only (issue 36: the home page explained a CPU job's wait with nine lines of GPU quotas)."""
    admin, fleet = shared_fleet["admin"], shared_fleet["fleet"]
    user = make_user(db, "cora")
    team = make_team(db, user, "cpu-team")
    set_quota(db, admin, team, fleet, guaranteed=2, limit=4, weight=1)
    cpu_job = make_job(
        db, user, fleet, gpus_per_node=0, cpus_per_node=64, memory_per_node=2**30, team_id=team
    )
    gpu_job = make_job(db, user, fleet, gpus_per_node=8, nodes=3, team_id=team, preemptible=True)
    assert _placed(db, fleet) == []  # no node has 64 CPUs (32 each); the GPU job is past its team's limit
    reason = job(db, cpu_job)["state_reason"]
    assert reason.startswith("waiting for resources: needs 1 node × 64 CPUs, 1024 MB memory"), reason
    assert "GPU" not in reason and "guarantee" not in reason, reason
    assert "limit of 4 GPUs" in job(db, gpu_job)["state_reason"]  # a GPU job still hears of its quota
    assert db.call("team_waiting_now", cpu_job)[0]["team_waiting_now"] is None
    assert db.call("team_waiting_now", gpu_job)[0]["team_waiting_now"] is not None
    fit = db.call("placement_fit_now", cpu_job)[0]["placement_fit_now"]
    assert "GPU" not in fit and "32 CPUs, 256 GB memory on n" in fit, fit
