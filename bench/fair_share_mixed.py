"""Weighted fair share with mixed job sizes (issue 34; docs/teams.md "Fairness guarantee"), longer runs.

Two teams weighted 1:3 keep a fleet of --nodes × 8 GPUs saturated with 1/2/4/8-GPU jobs of random sizes and
run times, driven through the real stored functions (reserve_next, cancel_job) on a simulated clock
(tests/fair_share_sim.py), once per seed with quotas and once without (plain queue order). Prints, per seed,
each team's share of GPU-seconds and its error against its weight's share, and the utilisation ratio
(fair share ÷ without; target 0.9 or more); then the worst and mean error of the weight-3 team.
Run: .venv/bin/python bench/fair_share_mixed.py [--placements 2000] [--seeds 5] [--nodes 4] [--backlog 6]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from embedded_db import migrated_database

from tests import fair_share_sim
from tuneplane.app.db import Database


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--placements", type=int, default=2000)
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--nodes", type=int, default=4)
    parser.add_argument("--backlog", type=int, default=6)
    args = parser.parse_args()
    errors: list[float] = []
    with migrated_database("fairshare") as url:
        db = Database(url, max_size=2, name="bench-fair-share")
        try:
            for seed in range(1, args.seeds + 1):
                runs = {
                    fair: fair_share_sim.run(
                        db,
                        f"s{seed}-{'fair' if fair else 'plain'}",
                        seed=seed,
                        fair_share=fair,
                        placements=args.placements,
                        nodes=args.nodes,
                        backlog=args.backlog,
                    )
                    for fair in (True, False)
                }
                fair = runs[True]
                heavy = max(fair.weights, key=fair.weights.__getitem__)
                errors.append(fair.error(heavy))
                shares = ", ".join(
                    f"weight {fair.weights[t]:g}: {fair.share(t):.3f} (error {fair.error(t):.1%})"
                    for t in fair.weights
                )
                print(
                    f"seed {seed}: {shares}; utilisation {fair.utilisation:.3f} with fair share, "
                    f"{runs[False].utilisation:.3f} without, "
                    f"ratio {fair.utilisation / runs[False].utilisation:.3f}",
                    flush=True,
                )
        finally:
            db.close()
    print(
        f"weight-3 team's error: worst {max(errors):.1%}, mean {sum(errors) / len(errors):.1%} (target 10 %)"
    )


if __name__ == "__main__":
    main()
