"""The per-(team, fleet) count of GPUs and members held (team_fleet_held, migration 0225), which placement
reads instead of summing every live member of the fleet on every pass, on the real stored functions.

It must always equal the sum over the live members (team_fleet_held_recount): after random sequences of
submissions, placement passes, starts, exits, cancels, fences and unfences (a property test), for a fleet
whose count did not exist yet (a database upgraded while jobs held GPUs), and between two passes (readers
see the releases not folded yet).
"""

from __future__ import annotations

import itertools

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.launch_fixtures import (
    agent_returns,
    assert_team_held_counted,
    make_job,
    make_node,
    make_team,
    make_user,
    members_of,
    report,
    run_to_running,
    set_quota,
)
from tuneplane.app.db import Database
from tuneplane.app.errors import Refusal

_fleets = itertools.count()

SUBMIT = st.tuples(
    st.just("submit"),
    st.integers(0, 1),  # team
    st.integers(1, 2),  # nodes
    st.integers(0, 3),  # GPUs per node (0: a member that holds no GPU index)
    st.booleans(),  # preemptible
)
# Submissions and passes weighted up, so that the fleet fills and most steps move what is held.
OPS = st.one_of(
    SUBMIT,
    SUBMIT,
    SUBMIT,
    st.tuples(st.just("pass")),
    st.tuples(st.just("pass")),
    st.tuples(st.just("run"), st.integers(0, 50)),
    st.tuples(st.just("exit"), st.integers(0, 50)),
    st.tuples(st.just("cancel"), st.integers(0, 50)),
    st.tuples(st.just("fence"), st.integers(0, 2)),
    st.tuples(st.just("unfence"), st.integers(0, 2)),
)


def _pass(db: Database, fleet: int) -> list[int]:
    # Simulated agents heartbeat before every pass (a slow run must not make their nodes stale).
    db.fetch_all("UPDATE nodes SET last_heartbeat_at = now() WHERE fleet_id = %s RETURNING id", (fleet,))
    return [r["job_id"] for r in db.call("reserve_next", fleet, 100)]


def _jobs_in(db: Database, fleet: int, states: tuple[str, ...]) -> list[int]:
    rows = db.fetch_all(
        "SELECT id FROM jobs WHERE fleet_id = %s AND state = ANY (%s) ORDER BY id", (fleet, list(states))
    )
    return [r["id"] for r in rows]


def test_the_count_equals_the_members_after_random_reserve_release_cancel_fence(db: Database) -> None:
    admin = make_user(db, "root", "admin")
    seen = {"placed": 0, "released": 0}

    @settings(
        max_examples=30,
        stateful_step_count=1,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(st.lists(OPS, min_size=15, max_size=30))
    def example(ops: list[tuple]) -> None:
        n = next(_fleets)
        fleet = db.fetch_one(
            "INSERT INTO fleets (name, backend) VALUES (%s, 'node') RETURNING id", (f"held{n}",)
        )["id"]
        names = [f"held{n}/h{i}" for i in range(3)]
        node_ids = [make_node(db, fleet, f"h{i}", gpus=4) for i in range(3)]
        epochs: dict[int, int] = {}  # node -> its agent's current session (0: never opened one)
        user = make_user(db, f"u{n}")
        teams = [make_team(db, user, f"ha{n}"), make_team(db, user, f"hb{n}")]
        set_quota(db, admin, teams[0], fleet, guaranteed=4, limit=8)
        set_quota(db, admin, teams[1], fleet, guaranteed=0, weight=2)
        for op in ops:
            kind = op[0]
            if kind == "submit":
                _, team, nodes, gpus, preemptible = op
                make_job(
                    db,
                    user,
                    fleet,
                    nodes=nodes,
                    gpus_per_node=gpus,
                    team_id=teams[team],
                    preemptible=preemptible,
                )
            elif kind == "pass":
                seen["placed"] += len(_pass(db, fleet))
            elif kind == "run":
                reserved = _jobs_in(db, fleet, ("reserved",))
                if reserved:
                    try:
                        run_to_running(db, reserved[op[1] % len(reserved)], epochs)
                    except Refusal:
                        pass  # a report refused (its node was fenced): the launch stops there
            elif kind == "exit":
                running = _jobs_in(db, fleet, ("running",))
                if running:
                    for m in members_of(db, running[op[1] % len(running)]):
                        if m["state"] == "running":
                            try:
                                report(db, "member_exited", m, epochs, exit_code=0)
                            except Refusal:
                                pass  # its node was fenced: the report is refused
            elif kind == "cancel":
                live = _jobs_in(db, fleet, ("queued", "reserved", "preparing", "running"))
                if live:
                    db.call("cancel_job", live[op[1] % len(live)], admin, "property test")
            elif kind == "fence":
                try:
                    db.call("fence_node", names[op[1]], "property test", "test")
                except Refusal:
                    pass  # already fenced: refused, nothing changed
            elif kind == "unfence":
                # Its agent comes back (reconnects, reconciles: it runs nothing); the operator unfences.
                epochs[node_ids[op[1]]] = agent_returns(db, node_ids[op[1]])
                try:
                    db.call("unfence_node", names[op[1]], "property test", "test")
                except Refusal:
                    pass  # not fenced: refused, nothing changed
            assert_team_held_counted(db, [fleet])
        seen["released"] += db.fetch_one(
            """SELECT count(*) AS n FROM members m JOIN nodes n ON n.id = m.node_id
                WHERE n.fleet_id = %s AND m.released_at IS NOT NULL""",
            (fleet,),
        )["n"]

    example()
    # The examples placed and released (the count moved both ways), not only submitted.
    assert seen["placed"] > 10 and seen["released"] > 5, seen


def _one_team_fleet(db: Database) -> tuple[int, int, int, int]:
    """(admin, fleet, user, team): one 8-GPU node, one team guaranteed all of it."""
    admin = make_user(db, "root", "admin")
    fleet = db.fetch_one("INSERT INTO fleets (name, backend) VALUES ('gpu', 'node') RETURNING id")["id"]
    make_node(db, fleet, "n1", gpus=8)
    user = make_user(db, "ann")
    team = make_team(db, user, "vision")
    set_quota(db, admin, team, fleet, guaranteed=8)
    return admin, fleet, user, team


def test_a_fleet_placed_on_before_the_count_existed_is_counted_by_its_next_pass(db: Database) -> None:
    admin, fleet, user, team = _one_team_fleet(db)
    jobs = [make_job(db, user, fleet, gpus_per_node=2, team_id=team) for _ in range(3)]
    assert sorted(_pass(db, fleet)) == jobs
    # A database upgraded to migration 0225 while these jobs held GPUs: no count yet for the fleet (test
    # setup: what the migration leaves); one job ends before the first pass under the new functions.
    db.fetch_all("DELETE FROM team_fleet_held_built WHERE fleet_id = %s RETURNING 1", (fleet,))
    db.fetch_all("DELETE FROM team_fleet_held WHERE fleet_id = %s RETURNING 1", (fleet,))
    db.call("cancel_job", jobs[0], admin, "ended")
    # Readers recount a fleet without a count; the next pass builds it from the members.
    assert [(r["team_id"], r["gpus"], r["members"]) for r in db.call("team_fleet_held_now", fleet)] == [
        (team, 4, 2)
    ]
    assert_team_held_counted(db, [fleet])
    _pass(db, fleet)
    assert (
        db.fetch_one("SELECT count(*) AS n FROM team_fleet_held_built WHERE fleet_id = %s", (fleet,))["n"]
        == 1
    )
    assert db.fetch_all("SELECT * FROM team_fleet_held_changes WHERE fleet_id = %s", (fleet,)) == []
    held = db.fetch_one(
        "SELECT gpus, members FROM team_fleet_held WHERE fleet_id = %s AND team_id = %s", (fleet, team)
    )
    assert held == {"gpus": 4, "members": 2}
    assert_team_held_counted(db, [fleet])


def test_a_release_is_seen_before_the_next_pass_folds_it(db: Database) -> None:
    admin, fleet, user, team = _one_team_fleet(db)
    jobs = [make_job(db, user, fleet, nodes=1, gpus_per_node=3, team_id=team) for _ in range(2)]
    assert sorted(_pass(db, fleet)) == jobs
    db.call("cancel_job", jobs[1], admin, "ended")
    # The release wrote a change row (its team holds 3 GPUs less); the count's readers add it.
    changes = db.fetch_all(
        "SELECT team_id, gpus, members FROM team_fleet_held_changes WHERE fleet_id = %s", (fleet,)
    )
    assert changes == [{"team_id": team, "gpus": -3, "members": -1}]
    assert [(r["gpus"], r["members"]) for r in db.call("team_fleet_held_now", fleet)] == [(3, 1)]
    (shares,) = [s for s in db.call("fleet_team_shares", fleet) if s["team_id"] == team]
    assert shares["used_gpus"] == 3
    # The last member goes: the team holds nothing and is no longer listed as holding (as in the recount).
    db.call("cancel_job", jobs[0], admin, "ended")
    assert db.call("team_fleet_held_now", fleet) == []
    _pass(db, fleet)
    assert db.fetch_all("SELECT * FROM team_fleet_held_changes WHERE fleet_id = %s", (fleet,)) == []
    assert db.call("team_fleet_held_now", fleet) == []
    assert_team_held_counted(db, [fleet])
