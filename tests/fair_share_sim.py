"""A saturated fleet shared by two teams, driven through the real placement functions on a simulated clock.

Used by tests/db/test_fair_share_mixed.py (a short run) and bench/fair_share_mixed.py (longer runs, several
seeds). Each team keeps `backlog` jobs queued; every job it submits draws its size (GPUs on one node) and its
run time from the team's own seeded stream, so the run with fair share and the run without it (the same
fleet, no quota rows: plain queue order) see the same jobs. A job "runs" from the pass that reserved it until
its simulated end, when cancel_job releases its GPUs as a finished member would (release_member).
"""

from __future__ import annotations

import heapq
import random
from dataclasses import dataclass, field

from tests.launch_fixtures import make_job, make_node  # the same rows every placement test uses
from tuneplane.app.db import Database

SIZES = (1, 2, 4, 8)


@dataclass
class Outcome:
    gpu_seconds: dict[str, float]  # per team name
    weights: dict[str, float]
    elapsed: float  # simulated seconds
    fleet_gpus: int
    placements: int
    reasons: list[str] = field(default_factory=list)  # state_reason of every queued job at the end

    def share(self, team: str) -> float:
        return self.gpu_seconds[team] / sum(self.gpu_seconds.values())

    def target(self, team: str) -> float:
        return self.weights[team] / sum(self.weights.values())

    def error(self, team: str) -> float:
        """Relative error of the team's share of GPU-seconds against its weight's share."""
        return abs(self.share(team) - self.target(team)) / self.target(team)

    @property
    def utilisation(self) -> float:
        return sum(self.gpu_seconds.values()) / (self.fleet_gpus * self.elapsed)


def run(
    db: Database,
    name: str,
    seed: int,
    fair_share: bool,
    placements: int = 400,
    nodes: int = 4,
    gpus_per_node: int = 8,
    weights: tuple[float, float] = (1.0, 3.0),
    backlog: int = 6,
    warmup: int = 50,
) -> Outcome:
    """Simulate until `placements` jobs were placed after the first `warmup` ones (the fleet filling up from
    empty, when each team's whole first backlog fits: not counted); fleet, users and teams get names
    prefixed by `name`."""
    admin = db.fetch_one(
        "INSERT INTO users (username, role) VALUES (%s, 'admin') RETURNING id", (name + "-root",)
    )
    fleet = db.fetch_one("INSERT INTO fleets (name, backend) VALUES (%s, 'node') RETURNING id", (name,))["id"]
    for i in range(nodes):
        make_node(db, fleet, f"{name}-n{i + 1}", gpus=gpus_per_node, cpus=64, address=f"10.0.0.{i + 1}")
    teams: dict[int, str] = {}
    owners: dict[int, int] = {}
    streams: dict[int, random.Random] = {}
    for k, weight in enumerate(weights):
        team_name = f"{name}-t{k}-w{weight:g}"
        user = db.fetch_one(
            "INSERT INTO users (username, role) VALUES (%s, 'user') RETURNING id", (team_name + "-user",)
        )["id"]
        team = db.call("create_team", admin["id"], team_name)[0]["id"]
        if fair_share:
            db.call("set_team_quota", admin["id"], team, fleet, "", 0, None, weight, False)
        teams[team], owners[team], streams[team] = team_name, user, random.Random(f"{seed}/{k}")

    team_of: dict[int, int] = {}
    runtime: dict[int, float] = {}

    def submit(team: int) -> None:
        rng = streams[team]
        gpus, secs = rng.choice(SIZES), rng.uniform(1.0, 10.0)
        j = make_job(db, owners[team], fleet, gpus_per_node=gpus, team_id=team, preemptible=True)
        team_of[j], runtime[j] = team, secs

    for _ in range(backlog):
        for team in teams:
            submit(team)
    gpu_seconds = {n: 0.0 for n in teams.values()}
    running: list[tuple[float, int, int]] = []  # (simulated end, job, GPUs)
    now, placed, start = 0.0, 0, None
    while placed < warmup + placements:
        # Simulated agents heartbeat before every pass (a slow run must not make the nodes stale).
        db.fetch_all("UPDATE nodes SET last_heartbeat_at = now() WHERE fleet_id = %s RETURNING id", (fleet,))
        for row in db.call("reserve_next", fleet, 1000):
            j = row["job_id"]
            gpus = db.fetch_one("SELECT gpus_per_node * nodes AS g FROM jobs WHERE id = %s", (j,))["g"]
            heapq.heappush(running, (now + runtime[j], j, gpus))
            placed += 1
            submit(team_of[j])  # keep the team's backlog
        assert running, "nothing runs and nothing was placed"
        end = running[0][0]
        if start is None and placed >= warmup:
            start = now
        for _end, r, gpus in running:  # GPU-seconds of the interval (now, end], once warmed up
            gpu_seconds[teams[team_of[r]]] += gpus * (end - now) if start is not None else 0.0
        now = end
        while running and running[0][0] <= end:
            _end, j, _gpus = heapq.heappop(running)
            db.call("cancel_job", j, admin["id"], "simulated end")
    reasons = [
        r["state_reason"]
        for r in db.fetch_all(
            "SELECT state_reason FROM jobs WHERE fleet_id = %s AND state = 'queued'", (fleet,)
        )
    ]
    return Outcome(
        gpu_seconds=gpu_seconds,
        weights={teams[t]: w for t, w in zip(teams, weights, strict=True)},
        elapsed=now - (start or 0.0),
        fleet_gpus=nodes * gpus_per_node,
        placements=placed - warmup,
        reasons=reasons,
    )
