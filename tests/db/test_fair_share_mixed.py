"""Weighted fair share holds for mixed job sizes (issue 34; docs/teams.md "Fairness guarantee").

Two teams weighted 1:3 keep a fleet of 4 × 8 GPUs saturated with 1/2/4/8-GPU jobs of random sizes and run
times (seeded), driven through the real stored functions (reserve_next, cancel_job) on a simulated clock
(tests/fair_share_sim.py). Each team's share of GPU-seconds must come within 10 % of its weight's share, and
the fleet's GPU utilisation must stay at 0.9 × or more of the same jobs without quotas (plain queue order).
bench/fair_share_mixed.py runs the same simulation longer and over several seeds. The smaller tests show the
two rules behind it: the head keeps its claim across passes, and a borrower of a team above the waiting
head's team per weight yields to it (the reasons say what is held and for whom).
"""

from __future__ import annotations

from tests import fair_share_sim
from tests.launch_fixtures import job, make_fleet, make_job, make_node, make_team, make_user, set_quota
from tuneplane.app.db import Database


def test_teams_weighted_1_to_3_get_1_to_3_of_gpu_seconds_with_mixed_job_sizes(db: Database) -> None:
    fair = fair_share_sim.run(db, "fair", seed=34, fair_share=True, placements=400)
    plain = fair_share_sim.run(db, "plain", seed=34, fair_share=False, placements=400)
    shares = ", ".join(
        f"{t} {fair.share(t):.3f} (target {fair.target(t):.3f}, error {fair.error(t):.1%})"
        for t in fair.weights
    )
    print(f"\nfair share of GPU-seconds: {shares}")
    print(
        f"utilisation: {fair.utilisation:.3f} with fair share, {plain.utilisation:.3f} without "
        f"(ratio {fair.utilisation / plain.utilisation:.3f})"
    )
    # Within 10 % of the weight-3 team's share (0.75 ± 0.075): the weight-1 team's share is off by the same
    # amount the other way. Before the kept claim and the yield (ADR 0270) it was 0.665, 11.3 % off.
    heavy = max(fair.weights, key=fair.weights.__getitem__)
    assert fair.error(heavy) <= 0.10, shares
    assert fair.utilisation >= 0.9 * plain.utilisation, (fair.utilisation, plain.utilisation)


def _pass(db: Database, fleet: int) -> list[int]:
    return [r["job_id"] for r in db.call("reserve_next", fleet, 1000)]


def _node_of(db: Database, job_id: int) -> str:
    return db.fetch_one(
        "SELECT n.name FROM members m JOIN nodes n ON n.id = m.node_id WHERE m.job_id = %s", (job_id,)
    )["name"]


def test_a_borrower_of_a_team_above_its_share_yields_to_the_head_of_a_team_below_it(db: Database) -> None:
    admin = make_user(db, "root", "admin")
    fleet = make_fleet(db, "gpu")
    make_node(db, fleet, "n1", gpus=8)
    make_node(db, fleet, "n2", gpus=8)
    users = {name: make_user(db, name) for name in ("ann", "bob")}
    nlp, vision = make_team(db, users["ann"], "nlp"), make_team(db, users["bob"], "vision")
    set_quota(db, admin, nlp, fleet, guaranteed=0, weight=1)
    set_quota(db, admin, vision, fleet, guaranteed=0, weight=3)

    def submit(team: int, gpus: int) -> int:
        owner = users["ann"] if team == nlp else users["bob"]
        return make_job(db, owner, fleet, gpus_per_node=gpus, team_id=team, preemptible=True)

    big_nlp = submit(nlp, 8)
    assert _pass(db, fleet) == [big_nlp]
    half_vision = submit(vision, 4)
    assert _pass(db, fleet) == [half_vision]
    # vision holds 4 (1.3 per weight), nlp 8: vision's 8-GPU job does not fit and is the head; it claims the
    # node where it fits soonest (n2, 4 free), and nlp's 2-GPU job (nlp at 10 per weight) takes nothing.
    head = submit(vision, 8)
    small_nlp = submit(nlp, 2)
    assert _pass(db, fleet) == []
    assert job(db, head)["state_reason"].startswith(
        "waiting for resources: needs 1 node × 8 GPUs, 1 CPU, 0 bytes memory; at the head of the queue, "
        "waiting for capacity to free up; node n2 held for it (team vision); to borrow idle GPUs: team vision"
    ), job(db, head)["state_reason"]
    assert job(db, small_nlp)["state_reason"].startswith(
        "waiting for resources: needs 1 node × 2 GPUs, 1 CPU, 0 bytes memory; free GPUs are kept for job "
        f"{head} at the head of the queue: team vision is below its fair share while it waits (node n2 held "
        "for it); to borrow idle GPUs: team nlp on fleet gpu"
    ), job(db, small_nlp)["state_reason"]
    # vision's own smaller jobs still backfill where the head's room is not taken: none fits beside it on n2.
    assert db.fetch_all("SELECT job_id FROM head_claims WHERE fleet_id = %s", (fleet,)) == [{"job_id": head}]
    db.call("cancel_job", half_vision, admin, "simulated end")
    assert _pass(db, fleet) == [head]  # the room gathered on n2 went to the head, not to nlp's job
    assert _node_of(db, head) == "n2"
    # The next job that does not fit claims afresh: nlp's, now that nothing else waits.
    assert db.fetch_all("SELECT job_id FROM head_claims WHERE fleet_id = %s", (fleet,)) == [
        {"job_id": small_nlp}
    ]


def test_the_head_keeps_its_claimed_node_across_passes(db: Database) -> None:
    admin = make_user(db, "root", "admin")
    user = make_user(db, "ann")
    fleet = make_fleet(db, "plain")
    make_node(db, fleet, "n1", gpus=4)
    make_node(db, fleet, "n2", gpus=4)
    placed = {}
    for gpus in (2, 3, 1):  # n1 takes the 2-GPU job; n2 the 3-GPU one, then the 1-GPU one (best fit)
        placed[gpus] = make_job(db, user, fleet, gpus_per_node=gpus)
        assert _pass(db, fleet) == [placed[gpus]]
    assert [_node_of(db, placed[g]) for g in (2, 3, 1)] == ["n1", "n2", "n2"]
    # n1 has 2 free, n2 none: the 4-GPU head claims n1.
    head = make_job(db, user, fleet, gpus_per_node=4)
    assert _pass(db, fleet) == []
    assert job(db, head)["state_reason"].endswith("waiting for capacity to free up; node n1 held for it")
    # n2 now has 3 free: the claim stays on n1 (before, it moved to n2 and n1's 2 GPUs went to the next
    # small job), so a 1-GPU job goes to n2.
    db.call("cancel_job", placed[3], admin, "simulated end")
    late = make_job(db, user, fleet, gpus_per_node=1)
    assert _pass(db, fleet) == [late]
    assert _node_of(db, late) == "n2"
    assert job(db, head)["state_reason"].endswith("waiting for capacity to free up; node n1 held for it")
