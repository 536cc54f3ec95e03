"""Weighted fair share holds for mixed job sizes (issue 34; docs/teams.md "Fairness guarantee").

Two teams weighted 1:3 keep a fleet of 4 × 8 GPUs saturated with 1/2/4/8-GPU jobs of random sizes and run
times (seeded), driven through the real stored functions (reserve_next, cancel_job) on a simulated clock
(tests/fair_share_sim.py). Each team's share of GPU-seconds must come within 10 % of its weight's share, and
the fleet's GPU utilisation must stay at 0.9 × or more of the same jobs without quotas (plain queue order).
bench/fair_share_mixed.py runs the same simulation longer and over several seeds.
"""

from __future__ import annotations

from tests import fair_share_sim
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
    # amount the other way. Today (before the claim was kept and borrowers yielded) it is 0.63, 16 % off.
    heavy = max(fair.weights, key=fair.weights.__getitem__)
    assert fair.error(heavy) <= 0.10, shares
    assert fair.utilisation >= 0.9 * plain.utilisation, (fair.utilisation, plain.utilisation)
