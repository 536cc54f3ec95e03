"""Model-based test of the launch state machine: Hypothesis drives the real stored functions on a real
PostgreSQL through random interleavings of what users, workers, agents, networks and operators do, with
simulated agents that hold the physical truth (which workloads run on which GPUs). After every step it
checks the guarantees TunePlane promises:

- no GPU is used by two workloads, counting both what the database holds and what really runs;
- no member is released while its node may still run it (unless an operator fenced or retired the node);
- every decision is written once and never changes;
- every member is started at most once;
- every non-terminal job has a current reason; the resources of ended jobs are released;
- teams and quotas (two teams share the fleet, each with a guarantee, one with a limit; each borrows):
  no team ever holds more GPUs than its limit_gpus; after a placement pass the first job within its
  team's guarantee waits only when no free GPUs fit it; every job a pass leaves waiting has a reason that
  names its team's numbers; the GPUs and members each team holds, as counted for placement
  (team_fleet_held), equal the sum over its live members.
- preemption (priorities 0/50/100, preemptible or not, max_preemptions 1 or 2, victims that checkpoint
  and stop, ignore the request until their grace ends, or publish checkpoints): a non-preemptible job is
  never a victim; a victim has a strictly lower priority than its preemptor, or the decision's rule is
  reclaim, the victim's team was borrowing (it held more GPUs than its guarantee) and the preemptor was
  within its guarantee (two equal-priority teams never preempt each other except by reclaim); the nodes
  held for a preemptor are never given to another job while held; no job is preempted more than its
  max_preemptions; every attempt resumes from the job's newest checkpoint verified before it was
  prepared, and from none when there was none.
- reclaim (issue 20): after a placement pass, the first queued job within its team's guarantee never
  waits while preemptible borrowers of other teams, of priority <= its own and past min_runtime (whether
  they started before or after it was created), run where reclaiming them would make it fit, without a
  holding decision for it.

The agents are simulated (named so: SimAgent), the database and its functions are the real ones. Each
example works in a fleet of its own, so examples share one database without resetting it.

ReclaimModel drives teams, guarantees, borrowing and preemption alone (jobs start as soon as a pass
reserves them), so that reclaims happen in many of its examples: the same team and preemption checks
(TeamChecks), and a reclaimer's attempt is never reclaimed back.
"""

from __future__ import annotations

import hashlib
import itertools
import json
from dataclasses import dataclass, field

import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    rule,
    run_state_machine_as_test,
)

from tests.launch_fixtures import (
    assert_team_held_counted,
    make_fleet,
    make_job,
    make_node,
    make_team,
    make_user,
    report,
    run_to_running,
    set_quota,
)
from tuneplane.app.db import Database
from tuneplane.app.errors import Refusal

_fleets = itertools.count()
STEPS: list[int] = []
RACES: list[int] = []  # STARTs handled between taking a reconcile list and sending it
RECLAIMS: list[int] = []  # reclaim decisions per example (the reclaim invariants saw one)
CHECKED: list[int] = []  # passes after which a job within its guarantee was checked against lent GPUs
# What users and operators do, weighted: a node comes back into service more often than it leaves it.
OPERATOR_ACTIONS = ["cancel", "rotate", "fence", "unfence", "unfence", "uncordon", "uncordon"]
OPERATOR_ACTIONS += ["cordon", "drain", "retire"]


@dataclass
class SimAgent:
    """A node's agent as the model sees it: its session, what it was told, and what really runs."""

    node_id: int
    epoch: int | None = None  # current control session; None while disconnected
    reconciled: bool = False
    retired: bool = False
    running: dict[int, list[int]] = field(default_factory=dict)  # member id -> GPU indices (physical)
    ever_started: dict[int, int] = field(default_factory=dict)  # member id -> how many times started
    unreported_exits: dict[int, int] = field(default_factory=dict)
    inflight: list[dict] = field(default_factory=list)  # received, not yet handled (the connection dropped)
    preparing: set[int] = field(default_factory=set)
    asked_to_stop: set[int] = field(default_factory=set)  # PREEMPT received, workload still running
    credentials: list[tuple[int, str]] = field(default_factory=list)  # (id, hash), oldest first


class TeamChecks:
    """The teams-and-preemption checks both state machines make, over their fleet's real rows."""

    db: Database
    fleet: int
    user: int
    teams: list[int]

    def _submit(
        self,
        team: int,
        nodes: int,
        gpus: int,
        attempts: int,
        preemptible: bool,
        priority: int,
        max_preemptions: int,
    ) -> None:
        job_id = make_job(
            self.db,
            self.user,
            self.fleet,
            nodes=nodes,
            gpus_per_node=gpus,
            max_attempts=attempts,
            team_id=self.teams[team],
            preemptible=preemptible,
            priority=priority,
        )
        self.db.fetch_all(  # test setup: the JobSpec's preemption settings as a preview resolves them
            "UPDATE jobs SET spec = spec || %s WHERE id = %s RETURNING 1",
            (json.dumps({"preemption": {"max_preemptions": max_preemptions, "grace_seconds": 60}}), job_id),
        )

    def _reserve_checked(self) -> None:
        """One placement pass (reserve_next), then the checks that hold right after a pass."""
        before, holding_before = self._team_gpus(), self._holding()
        last = self.db.fetch_one(
            "SELECT coalesce(max(id), 0) AS id FROM preemptions WHERE fleet_id = %s", (self.fleet,)
        )["id"]
        self.db.call("reserve_next", self.fleet, 1000)
        self._reclaims_took_only_what_was_lent(before, last)
        if not holding_before:
            self._within_guarantee_never_waits_on_a_borrower()

    def _holding(self) -> list[dict]:
        return self.db.fetch_all(
            "SELECT id, preemptor_job_id FROM preemptions WHERE fleet_id = %s AND state = 'holding'",
            (self.fleet,),
        )

    def _guarantees(self) -> dict[int, int]:
        rows = self.db.fetch_all(
            "SELECT team_id, guaranteed_gpus FROM team_quotas WHERE fleet_id = %s AND gpu_model = ''",
            (self.fleet,),
        )
        return {r["team_id"]: r["guaranteed_gpus"] for r in rows}

    def _reclaims_took_only_what_was_lent(self, before: dict[int, int], last: int) -> None:
        """A reclaim decided in this pass: its preemptor's team held (before the pass, which only adds)
        little enough for the job to fit its guarantee, and each lender still holds more than its own."""
        guaranteed, after = self._guarantees(), self._team_gpus()
        for d in self.db.fetch_all(
            """SELECT p.numbers, j.team_id, j.nodes * j.gpus_per_node AS gpus FROM preemptions p
                 JOIN jobs j ON j.id = p.preemptor_job_id
                WHERE p.fleet_id = %s AND p.id > %s AND p.rule = 'reclaim'""",
            (self.fleet, last),
        ):
            assert before.get(d["team_id"], 0) + d["gpus"] <= guaranteed[d["team_id"]], d
            for lender in d["numbers"]["reclaim"]["lenders"]:
                assert lender["team_id"] != d["team_id"], d
                assert after.get(lender["team_id"], 0) > guaranteed[lender["team_id"]], (d, after)

    def _within_guarantee_never_waits_on_a_borrower(self) -> None:
        """Issue 20: the first queued job within its team's guarantee does not wait while preemptible
        borrowers of other teams (priority <= its own, past min_runtime: 0 here) run where preempting them
        would make it fit — a holding decision is made for it. Checked for every borrower, not only those
        that started after the job was created (the issue's words): the planner reclaims either, and a
        borrower placed while the fleet was idle, before the job came, is the common case. Lent: a team
        holding more than its guarantee lends its newest attempts whose GPUs add up to at most the excess."""
        held, guaranteed = self._team_gpus(), self._guarantees()
        holding = self._holding()
        queued = self.db.fetch_all(
            """SELECT j.id, j.team_id, j.nodes, j.gpus_per_node, j.nodes * j.gpus_per_node AS gpus,
                      tuneplane.preemption_backoff_reason(j) AS backoff
                 FROM jobs j WHERE j.fleet_id = %s AND j.state = 'queued'
                ORDER BY j.priority DESC, j.created_at, j.id""",
            (self.fleet,),
        )
        first = next(
            (j for j in queued if held.get(j["team_id"], 0) + j["gpus"] <= guaranteed.get(j["team_id"], 0)),
            None,
        )
        if first is None or first["backoff"] is not None:
            return
        if any(h["preemptor_job_id"] == first["id"] for h in holding):
            return  # its decision holds
        if holding:
            return  # nodes held for another preemptor are not its to plan with
        excess = {t: g - guaranteed.get(t, 0) for t, g in held.items() if t != first["team_id"]}
        lent: list[int] = []
        for team, over in excess.items():
            newest_first = self.db.fetch_all(
                """SELECT m.attempt_id, sum(cardinality(m.gpu_indices))::int AS gpus FROM members m
                     JOIN attempts t ON t.id = m.attempt_id JOIN jobs b ON b.id = m.job_id
                    WHERE t.fleet_id = %s AND b.team_id = %s AND m.released_at IS NULL
                    GROUP BY m.attempt_id, t.created_at, t.id ORDER BY t.created_at DESC, t.id DESC""",
                (self.fleet, team),
            )
            for row in newest_first:
                if row["gpus"] > over:
                    break
                over -= row["gpus"]
                lent.append(row["attempt_id"])
        fit = self.db.fetch_one(
            """WITH j AS (SELECT * FROM jobs WHERE id = %(job)s),
               borrowers AS (
                   SELECT t.id FROM attempts t JOIN jobs b ON b.id = t.job_id, j
                    WHERE t.id = ANY (%(lent)s) AND t.state = 'running' AND t.stop_kind IS NULL
                      AND t.cancel_requested_at IS NULL AND b.preemptible AND b.priority <= j.priority
                      AND b.preemptions_used < (b.spec -> 'preemption' ->> 'max_preemptions')::int),
               freed AS (
                   SELECT m.node_id, sum(cardinality(m.gpu_indices)) AS gpus FROM members m
                    WHERE m.attempt_id IN (SELECT id FROM borrowers) AND m.released_at IS NULL
                    GROUP BY m.node_id)
               SELECT count(*) FILTER (WHERE u.free_gpus >= j.gpus_per_node) AS free,
                      count(*) FILTER (WHERE u.free_gpus + coalesce(f.gpus, 0) >= j.gpus_per_node)
                          AS reclaimed
                 FROM j JOIN node_usage u ON u.fleet_id = j.fleet_id JOIN nodes n ON n.id = u.node_id
                 LEFT JOIN freed f ON f.node_id = u.node_id
                WHERE tuneplane.node_is_connected(n, tuneplane.node_fresh_since())""",
            {"job": first["id"], "lent": lent},
        )
        if fit["free"] >= first["nodes"]:
            return  # free GPUs fit it: the check above (within its guarantee it waits only if not fitting)
        CHECKED.append(first["id"])
        assert fit["reclaimed"] < first["nodes"], (
            f"job {first['id']} within its guarantee waits while lent GPUs would fit it: {fit}, "
            f"teams {held}, guarantees {guaranteed}"
        )

    def _team_gpus(self) -> dict[int, int]:
        rows = self.db.fetch_all(
            """SELECT j.team_id, sum(cardinality(m.gpu_indices))::int AS gpus FROM members m
                 JOIN jobs j ON j.id = m.job_id WHERE j.fleet_id = %s AND m.released_at IS NULL
                GROUP BY j.team_id""",
            (self.fleet,),
        )
        return {r["team_id"]: r["gpus"] for r in rows}

    def _victims_outranked_or_reclaimed(self) -> None:
        """A non-preemptible job is never a victim; a victim has a strictly lower priority than its
        preemptor, or it is a reclaim: its team held more than its guarantee, the preemptor's team held
        little enough for the job to fit its own."""
        victims = self.db.fetch_all(
            """SELECT v.job_id, v.priority, j.preemptible, j.team_id, p.preemptor_job_id, p.rule, p.numbers,
                      pj.priority AS preemptor_priority
                 FROM preemption_victims v JOIN preemptions p ON p.id = v.preemption_id
                 JOIN jobs j ON j.id = v.job_id JOIN jobs pj ON pj.id = p.preemptor_job_id
                WHERE p.fleet_id = %s""",
            (self.fleet,),
        )
        for v in victims:
            assert v["preemptible"], f"a non-preemptible job was a victim: {v}"
            if v["priority"] < v["preemptor_priority"]:
                continue
            # Not outranked: only a reclaim of GPUs its team borrowed, for a job within its guarantee.
            assert v["rule"] == "reclaim" and v["priority"] <= v["preemptor_priority"], f"not outranked: {v}"
            reclaim = v["numbers"]["reclaim"]
            assert reclaim["held"] + reclaim["asks"] <= reclaim["guaranteed"], v
            lender = [x for x in reclaim["lenders"] if x["team_id"] == v["team_id"]]
            assert lender and lender[0]["held"] > lender[0]["guaranteed"], v


class LaunchModel(TeamChecks, RuleBasedStateMachine):
    db: Database

    def __init__(self) -> None:
        super().__init__()
        n = next(_fleets)
        self.fleet = self.db.fetch_one(
            "INSERT INTO fleets (name, backend) VALUES (%s, 'node') RETURNING id", (f"model{n}",)
        )["id"]
        self.user = make_user(self.db, f"u{n}")
        self.admin = make_user(self.db, f"a{n}", "admin")
        self.agents = {}
        for i in range(3):
            node_id = make_node(self.db, self.fleet, f"m{n}n{i}", gpus=2)
            self.agents[node_id] = SimAgent(node_id)
            digest = self._new_hash()
            cred = self.db.fetch_one(  # test setup: the node's first credential, in use
                """INSERT INTO node_credentials (node_id, credential_hash, first_used_at)
                   VALUES (%s, %s, now()) RETURNING id""",
                (node_id, digest),
            )["id"]
            self.agents[node_id].credentials.append((cred, digest))
            self._open_session(self.agents[node_id], reconcile=True)
        self.decisions: dict[int, str] = {}
        self.steps = 0
        # Two teams share the 6 GPUs: one is guaranteed 2 (limit 4), the other 1 (no limit, weight 2); each
        # lends what it does not use, so each may reclaim from the other.
        self.teams = [make_team(self.db, self.user, f"ta{n}"), make_team(self.db, self.user, f"tb{n}")]
        self.limits = {self.teams[0]: 4, self.teams[1]: None}
        set_quota(self.db, self.admin, self.teams[0], self.fleet, guaranteed=2, limit=4, weight=1)
        set_quota(self.db, self.admin, self.teams[1], self.fleet, guaranteed=1, weight=2)
        # Preemption without waiting: victims of any age (the installation setting, one per database).
        self.db.fetch_all("UPDATE preemption_settings SET min_runtime = interval '0' RETURNING 1")

    # ---- helpers -------------------------------------------------------------------------------------

    _hashes = itertools.count()

    def _new_hash(self) -> str:
        return hashlib.sha256(f"model-credential-{next(self._hashes)}".encode()).hexdigest()

    def _call(self, fn: str, *args):
        return self.db.call(fn, *args)

    def _report(self, agent: SimAgent, kind: str, payload: dict) -> bool:
        """Send a report on the agent's current session; False when there is none or it is refused."""
        if agent.epoch is None or agent.retired:
            return False
        try:
            self._call(kind, agent.node_id, agent.epoch, json.dumps(payload))
            return True
        except Refusal as refusal:
            assert refusal.status in (404, 409), refusal
            return False

    def _open_session(self, agent: SimAgent, reconcile: bool, handle_inflight_first: bool = False) -> None:
        agent.epoch = self._call("node_session_opened", agent.node_id, "127.0.0.1", "model")[0]["epoch"]
        agent.reconciled = False
        if reconcile:
            listed = dict(agent.running)  # the list is taken first…
            if handle_inflight_first:
                RACES.append(sum(c["kind"] == "start" for c in agent.inflight))
                self._handle_inflight(agent)  # …then a START of the old session races it
            self._reconcile(agent, listed)

    def _reconcile(self, agent: SimAgent, listed: dict[int, list[int]]) -> None:
        body = {
            "running": [{"member_id": m, "pid": 1} for m in listed],
            "exited": [{"member_id": m, "exit_code": c} for m, c in agent.unreported_exits.items()],
        }
        if self._report(agent, "reconcile_node", body):
            agent.unreported_exits.clear()
            agent.reconciled = True
            self._handle_inflight(agent)

    def _handle_inflight(self, agent: SimAgent) -> None:
        while agent.inflight and agent.epoch is not None:
            self._handle(agent, agent.inflight.pop(0), start_error=False)

    def _gpus_of(self, member_id: int) -> list[int]:
        return self.db.fetch_one("SELECT gpu_indices FROM members WHERE id = %s", (member_id,))["gpu_indices"]

    def _end(self, agent: SimAgent, member_id: int, code: int) -> None:
        agent.running.pop(member_id, None)
        if (
            agent.epoch is None
            or not agent.reconciled
            or not self._report(agent, "member_exited", {"member_id": member_id, "exit_code": code})
        ):
            agent.unreported_exits[member_id] = code

    def _handle(self, agent: SimAgent, cmd: dict, start_error: bool) -> None:
        kind, payload, error = cmd["kind"], cmd["payload"], None
        if kind == "prepare":
            agent.preparing.add(payload["member_id"])
        elif kind == "start":
            mid = payload["member_id"]
            agent.preparing.discard(mid)
            if mid in agent.running or mid in agent.ever_started or mid in agent.unreported_exits:
                pass  # adopted: a member never starts twice
            elif start_error:
                error = "could not start (model)"
            else:
                agent.running[mid] = self._gpus_of(mid)
                agent.ever_started[mid] = agent.ever_started.get(mid, 0) + 1
                self._report(agent, "member_started", {"member_id": mid, "pid": 1})
        elif kind == "stop" and start_error:
            error = "could not signal (model)"  # the database escalates to KILL
        elif kind == "stop":
            mid = payload["member_id"]
            if mid in agent.running:
                self._end(agent, mid, -15)
            elif mid not in agent.unreported_exits:
                body = {"member_id": mid, "exit_code": None, "reason": "not here"}
                self._report(agent, "member_exited", body)
        elif kind == "kill":
            for mid in payload["member_ids"]:
                agent.running.pop(mid, None)
        elif kind == "abort":
            agent.preparing.discard(payload["member_id"])
        elif kind == "preempt" and payload["member_id"] in agent.running:
            agent.asked_to_stop.add(payload["member_id"])
        if agent.epoch is not None:
            try:
                self._call(
                    "ack_node_command", agent.node_id, agent.epoch, cmd["id"], json.dumps({"ok": True}), error
                )
            except Refusal as refusal:
                assert refusal.status == 409, refusal

    def _live_agents(self) -> list[SimAgent]:
        return [a for a in self.agents.values() if not a.retired]

    # ---- rules: users and workers --------------------------------------------------------------------

    @rule(
        nodes=st.integers(1, 2),
        gpus=st.integers(1, 2),
        attempts=st.integers(1, 2),
        team=st.sampled_from([0, 0, 1]),
        preemptible=st.booleans(),
        priority=st.sampled_from([0, 0, 50, 100]),
        max_preemptions=st.sampled_from([1, 2]),
    )
    def confirm(
        self,
        nodes: int,
        gpus: int,
        attempts: int,
        team: int,
        preemptible: bool,
        priority: int,
        max_preemptions: int,
    ) -> None:
        self._submit(team, nodes, gpus, attempts, preemptible, priority, max_preemptions)

    def placement_pass(self) -> None:
        self._reserve_checked()
        self._after_pass_waiting_jobs_are_explained()

    def _after_pass_waiting_jobs_are_explained(self) -> None:
        """Checked right after every pass (later steps re-queue retries with their own words)."""
        queued = self.db.fetch_all(
            """SELECT j.id, j.team_id, j.nodes * j.gpus_per_node AS gpus, j.state_reason, t.name,
                      q.guaranteed_gpus, tuneplane.placement_fit_now(j.id) AS fit
                 FROM jobs j JOIN teams t ON t.id = j.team_id
                 JOIN team_quotas q ON q.team_id = j.team_id AND q.fleet_id = j.fleet_id
                WHERE j.fleet_id = %s AND j.state = 'queued' ORDER BY j.priority DESC, j.created_at, j.id""",
            (self.fleet,),
        )
        held = self._team_gpus()
        first_within = next(
            (j for j in queued if held.get(j["team_id"], 0) + j["gpus"] <= j["guaranteed_gpus"]), None
        )
        holding = self.db.fetch_one(
            "SELECT count(*) AS n FROM preemptions WHERE fleet_id = %s AND state = 'holding'", (self.fleet,)
        )["n"]
        if holding:
            first_within = None  # free GPUs on nodes held for a preemptor are not free for it
        for j in queued:
            assert f"team {j['name']} " in j["state_reason"], j
        if first_within is not None:
            # "best fit now: N nodes can take a member": within the guarantee it waits only if not fitting.
            fit = int(first_within["fit"].split()[3])
            assert (
                fit
                < self.db.fetch_one("SELECT nodes FROM jobs WHERE id = %s", (first_within["id"],))["nodes"]
            ), first_within

    def launch(self, crash: bool) -> None:
        for row in self.db.fetch_all(
            "SELECT a.id FROM attempts a WHERE a.fleet_id = %s AND a.state = 'reserved' ORDER BY a.id",
            (self.fleet,),
        ):
            epoch = self._call("claim_launch", row["id"], "model-worker")[0]["epoch"]
            if crash:  # the worker dies; another takes over with a newer epoch and the old one is fenced
                newer = self._call("claim_launch", row["id"], "model-worker-2")[0]["epoch"]
                with pytest.raises(Refusal):
                    self._call("begin_prepare", row["id"], epoch, "b" * 64)
                epoch = newer
            self._call("begin_prepare", row["id"], epoch, "a" * 64)

    def cancel(self, data: st.DataObject) -> None:
        jobs = self.db.fetch_all(
            "SELECT id FROM jobs WHERE fleet_id = %s AND state NOT IN ('succeeded', 'failed', 'cancelled')",
            (self.fleet,),
        )
        if jobs:
            self._call("cancel_job", data.draw(st.sampled_from([j["id"] for j in jobs])), self.admin, "model")

    @rule()
    def sweeps(self) -> None:
        self._call("sweep_lost_nodes")
        self._call("expire_prepare_deadlines")
        self._call("expire_member_deadlines")

    @rule(data=st.data(), deliver_starts=st.booleans(), crash=st.sampled_from([False, False, True]))
    def progress(self, data: st.DataObject, deliver_starts: bool, crash: bool) -> None:
        """The happy path in one step: a placement pass, launches (or a worker crashing mid-launch),
        PREPARE delivered and prepared, and (or not yet) the STARTs of the COMMIT delivered and handled."""
        self.placement_pass()
        self.launch(crash)
        for agent in self._live_agents():
            if agent.epoch is not None and agent.reconciled:
                for cmd in self._call("claim_node_commands", agent.node_id, agent.epoch, 100):
                    self._handle(agent, cmd, start_error=False)
        self.prepare_reports(data, False)
        if deliver_starts:
            for agent in self._live_agents():
                if agent.epoch is not None and agent.reconciled:
                    for cmd in self._call("claim_node_commands", agent.node_id, agent.epoch, 100):
                        self._handle(agent, cmd, start_error=False)
        elif data.draw(st.booleans()):
            # the gateway restarts between COMMIT and START, with the STARTs delivered but not handled
            self.gateway_restart(data, race=data.draw(st.booleans()))

    # ---- rules: agents and the network ---------------------------------------------------------------

    @rule(data=st.data(), fail=st.sampled_from([False, False, False, True]))
    def prepare_reports(self, data: st.DataObject, fail: bool) -> None:
        """Agents report the members they prepared; one of them may fail instead."""
        candidates = [(a, m) for a in self._live_agents() if a.reconciled for m in sorted(a.preparing)]
        if not candidates:
            return
        failing = data.draw(st.sampled_from(candidates)) if fail else None
        for agent, mid in candidates:
            agent.preparing.discard(mid)
            if (agent, mid) == failing:
                self._report(agent, "member_prepare_failed", {"member_id": mid, "reason": "model says no"})
            else:
                self._report(agent, "member_prepared", {"member_id": mid})

    @rule(data=st.data(), start_error=st.booleans())
    def deliver(self, data: st.DataObject, start_error: bool) -> None:
        """The gateway delivers a node's commands; the agent handles some, the rest stay in flight."""
        agents = [a for a in self._live_agents() if a.epoch is not None]
        if not agents:
            return
        agent = data.draw(st.sampled_from(agents))
        commands = self._call("claim_node_commands", agent.node_id, agent.epoch, 100)
        handled = len(commands) if data.draw(st.booleans()) else data.draw(st.integers(0, len(commands)))
        for cmd in commands[:handled]:
            self._handle(agent, cmd, start_error and cmd["kind"] in ("start", "stop"))
        agent.inflight.extend(commands[handled:])

    @rule(data=st.data(), publish=st.booleans())
    def victim_checkpoints_and_stops(self, data: st.DataObject, publish: bool) -> None:
        """A workload asked to stop publishes a checkpoint (or not) and exits 0."""
        asked = [(a, m) for a in self.agents.values() for m in sorted(a.asked_to_stop) if m in a.running]
        if asked:
            agent, mid = data.draw(st.sampled_from(asked))
            if publish:
                self._publish_checkpoint(agent, mid)
            agent.asked_to_stop.discard(mid)
            self._end(agent, mid, 0)

    @rule(data=st.data())
    def workload_checkpoints(self, data: st.DataObject) -> None:
        """A running workload publishes a checkpoint (complete at once: an empty manifest)."""
        running = [(a, m) for a in self._live_agents() if a.epoch is not None for m in sorted(a.running)]
        if running:
            self._publish_checkpoint(*data.draw(st.sampled_from(running)))

    def _publish_checkpoint(self, agent: SimAgent, member_id: int) -> None:
        manifest = {"files": [], "version": 1}
        digest = hashlib.sha256(
            json.dumps(manifest, separators=(",", ":"), sort_keys=True).encode()
        ).hexdigest()
        name = f"ckpt.{next(self._checkpoints)}"
        try:
            self._call(
                "register_artifact", agent.credentials[-1][1], member_id, name, "checkpoint", "object",
                json.dumps(manifest), digest, None,
            )  # fmt: skip
        except Refusal as refusal:
            assert refusal.status in (403, 404, 409, 410, 422), refusal  # the member is no longer live here

    _checkpoints = itertools.count(1)

    @rule()
    def grace_ends(self) -> None:
        """Time passes (test setup): every standing grace ends, and the sweep stops what still runs."""
        self.db.fetch_all(
            """UPDATE attempts SET grace_deadline = least(grace_deadline, now() - interval '1 second')
                WHERE fleet_id = %s AND stop_kind IS NOT NULL AND state IN ('running', 'stopping')
            RETURNING 1""",
            (self.fleet,),
        )
        self._call("expire_grace_deadlines")

    @rule(data=st.data(), code=st.sampled_from([0, 0, 1]))
    def workload_exits(self, data: st.DataObject, code: int) -> None:
        running = [(a, m) for a in self.agents.values() for m in sorted(a.running)]
        if running:
            agent, mid = data.draw(st.sampled_from(running))
            self._end(agent, mid, code)

    @rule(data=st.data(), action=st.sampled_from(["drop", "drop_silent", "reconnect", "late_reconcile"]))
    def network(self, data: st.DataObject, action: str) -> None:
        """A control connection drops (maybe for long: the node's heartbeat goes stale), an agent
        reconnects (with or without reconciling, maybe with an old START racing its list), or reconciles
        late."""
        if action.startswith("drop"):
            self.connection_drops(data, lose_heartbeat=action == "drop_silent")
        elif action == "reconnect":
            self.reconnect(data, reconcile=data.draw(st.booleans()), race=data.draw(st.booleans()))
        else:
            self.late_reconcile(data)

    def connection_drops(self, data: st.DataObject, lose_heartbeat: bool) -> None:
        agents = [a for a in self._live_agents() if a.epoch is not None]
        if not agents:
            return
        agent = data.draw(st.sampled_from(agents))
        self._call("node_session_closed", agent.node_id, agent.epoch, "model: connection dropped")
        agent.epoch, agent.reconciled = None, False
        if lose_heartbeat:  # test setup: the node has been silent for long (the sweep marks contact lost)
            self.db.fetch_all(
                "UPDATE nodes SET last_heartbeat_at = now() - interval '1 hour' WHERE id = %s RETURNING id",
                (agent.node_id,),
            )

    def reconnect(self, data: st.DataObject, reconcile: bool, race: bool) -> None:
        """A new session (also what a gateway restart looks like): with or without its reconcile, and
        with the old session's in-flight START handled after the reconcile list was taken."""
        agents = self._live_agents()
        if agents:
            agent = data.draw(st.sampled_from(agents))
            self._open_session(agent, reconcile=reconcile, handle_inflight_first=race)

    @rule(data=st.data(), race=st.booleans())
    def gateway_restart(self, data: st.DataObject, race: bool) -> None:
        """The gateway delivered commands (a START after COMMIT, say) and restarted before the agent
        handled them; the agent reconnects and handles them around its reconcile."""
        agents = [a for a in self._live_agents() if a.epoch is not None and a.reconciled]
        with_start = [
            a
            for a in agents
            if self.db.fetch_one(
                "SELECT count(*) AS n FROM node_commands"
                " WHERE node_id = %s AND kind = 'start' AND acked_at IS NULL",
                (a.node_id,),
            )["n"]
        ]
        if not agents:
            return
        agent = data.draw(st.sampled_from(with_start or agents))
        agent.inflight.extend(self._call("claim_node_commands", agent.node_id, agent.epoch, 100))
        self._call("node_session_closed", agent.node_id, agent.epoch, "model: gateway restarted")
        agent.epoch, agent.reconciled = None, False
        self._open_session(agent, reconcile=True, handle_inflight_first=race)

    def late_reconcile(self, data: st.DataObject) -> None:
        agents = [a for a in self._live_agents() if a.epoch is not None and not a.reconciled]
        if agents:
            agent = data.draw(st.sampled_from(agents))
            self._reconcile(agent, dict(agent.running))

    def rotate_credential(self, data: st.DataObject, stale_first: bool) -> None:
        """The gateway rotates a node's credential; a stale copy of an older one (still in its grace
        period) trying to rotate is refused and cannot lock the real agent out."""
        agents = self._live_agents()
        if not agents:
            return
        agent = data.draw(st.sampled_from(agents))
        if stale_first and len(agent.credentials) > 1:
            with pytest.raises(Refusal):
                stale = agent.credentials[-2][0]
                self._call("rotate_node_credential", agent.node_id, stale, self._new_hash())
        digest = self._new_hash()
        new_id = self._call("rotate_node_credential", agent.node_id, agent.credentials[-1][0], digest)[0][
            "rotate_node_credential"
        ]
        self._call("confirm_node_credential", agent.node_id, new_id)
        agent.credentials.append((new_id, digest))

    # ---- rules: operators ----------------------------------------------------------------------------

    @rule(
        data=st.data(),
        action=st.sampled_from(OPERATOR_ACTIONS),
    )
    def operator(self, data: st.DataObject, action: str) -> None:
        """A user cancels; the gateway rotates a credential; an operator fences (declares dead), unfences
        (refused until the agent came back, reconciled and acknowledged the KILLs), cordons, drains,
        uncordons or retires a node."""
        if action == "cancel":
            self.cancel(data)
            return
        if action == "rotate":
            self.rotate_credential(data, data.draw(st.booleans()))
            return
        agents = self._live_agents()
        if not agents or (action == "retire" and len(agents) < 3):
            return
        agent = data.draw(st.sampled_from(agents))
        node = str(agent.node_id)
        if action == "fence":
            self._call("fence_node", node, "model", "model")
        elif action == "unfence":
            try:
                self._call("unfence_node", node, "model", "model")
            except Refusal as refusal:
                assert refusal.status == 409, refusal
        else:
            self._call("change_node_scheduling", node, action, "model", "model")
            if action == "retire":
                agent.retired, agent.epoch = True, None

    # ---- invariants ----------------------------------------------------------------------------------

    @invariant()
    def no_gpu_used_twice(self) -> None:
        self.steps += 1
        held = self.db.fetch_all(
            """SELECT m.id, m.node_id, m.gpu_indices FROM members m JOIN nodes n ON n.id = m.node_id
                WHERE n.fleet_id = %s AND m.released_at IS NULL""",
            (self.fleet,),
        )
        for agent in self.agents.values():
            users: dict[int, set[int]] = {}
            for row in held:
                if row["node_id"] == agent.node_id:
                    for g in row["gpu_indices"]:
                        users.setdefault(g, set()).add(row["id"])
            for mid, gpus in agent.running.items():
                for g in gpus:
                    users.setdefault(g, set()).add(mid)
            assert all(len(u) == 1 for u in users.values()), f"node {agent.node_id}: GPUs in use {users}"

    @invariant()
    def nothing_released_that_may_still_run(self) -> None:
        for agent in self.agents.values():
            if not agent.running:
                continue
            node = self.db.fetch_one(
                "SELECT fenced_at, scheduling_state FROM nodes WHERE id = %s", (agent.node_id,)
            )
            if node["fenced_at"] is not None or node["scheduling_state"] == "retired":
                continue  # an operator declared the node dead; it gets no work until it proves otherwise
            rows = self.db.fetch_all(
                "SELECT id, state, released_at FROM members WHERE id = ANY(%s)", (list(agent.running),)
            )
            released = [r for r in rows if r["released_at"] is not None]
            assert not released, f"released while still running on node {agent.node_id}: {released}"

    @invariant()
    def newest_credential_always_works(self) -> None:
        for agent in self._live_agents():
            (row,) = self._call("authenticate_node_credential", agent.credentials[-1][1])
            assert row["node_id"] == agent.node_id

    @invariant()
    def decisions_are_final_and_members_start_once(self) -> None:
        for row in self.db.fetch_all(
            """SELECT d.attempt_id, d.decision FROM launch_decisions d JOIN attempts a ON a.id = d.attempt_id
                WHERE a.fleet_id = %s""",
            (self.fleet,),
        ):
            assert self.decisions.setdefault(row["attempt_id"], row["decision"]) == row["decision"]
        for agent in self.agents.values():
            assert all(n == 1 for n in agent.ever_started.values()), agent.ever_started

    @invariant()
    def no_team_past_its_limit(self) -> None:
        for team, gpus in self._team_gpus().items():
            limit = self.limits.get(team)
            assert limit is None or gpus <= limit, (team, gpus, limit)

    @invariant()
    def held_gpus_counted_exactly(self) -> None:
        # The per-(team, fleet) count that placement reads equals the sum over the live members, after every
        # reserve, release, cancel, fence and retire (team_fleet_held, migration 0225).
        assert_team_held_counted(self.db, [self.fleet])

    @invariant()
    def reasons_current_and_ended_jobs_released(self) -> None:
        rows = self.db.fetch_all(
            """SELECT j.id, j.state, j.state_reason,
                      (SELECT count(*) FROM members m WHERE m.job_id = j.id AND m.released_at IS NULL) AS held
                 FROM jobs j WHERE j.fleet_id = %s""",
            (self.fleet,),
        )
        for row in rows:
            assert row["state_reason"], row
            if row["state"] in ("succeeded", "failed", "cancelled", "queued"):
                assert row["held"] == 0, row

    @invariant()
    def preemption_keeps_its_promises(self) -> None:
        self._victims_outranked_or_reclaimed()
        stolen = self.db.fetch_all(
            """SELECT p.id, p.preemptor_job_id, m.job_id, m.node_id FROM preemptions p
                 JOIN members m ON m.node_id = ANY (p.held_node_ids) AND m.job_id <> p.preemptor_job_id
                 JOIN attempts a ON a.id = m.attempt_id
                WHERE p.fleet_id = %s AND a.created_at > p.created_at
                  AND (p.resolved_at IS NULL OR a.created_at < p.resolved_at)""",
            (self.fleet,),
        )
        assert not stolen, f"nodes held for a preemptor were given to another job: {stolen}"
        over = self.db.fetch_all(
            """SELECT j.id, count(*) AS n, (j.spec -> 'preemption' ->> 'max_preemptions')::int AS max
                 FROM attempts a JOIN jobs j ON j.id = a.job_id
                WHERE a.fleet_id = %s AND a.preempted_by_job_id IS NOT NULL
                GROUP BY j.id HAVING count(*) > (j.spec -> 'preemption' ->> 'max_preemptions')::int""",
            (self.fleet,),
        )
        assert not over, f"preempted more than max_preemptions: {over}"

    @invariant()
    def every_attempt_resumes_from_the_newest_verified_checkpoint(self) -> None:
        wrong = self.db.fetch_all(
            """SELECT a.job_id, a.number, a.resume_artifact_id,
                      (SELECT c.id FROM artifacts c
                        WHERE c.job_id = a.job_id AND c.kind = 'checkpoint' AND c.completed_at IS NOT NULL
                          AND c.completed_at < a.prepare_deadline - s.prepare_timeout
                        ORDER BY c.completed_at DESC, c.id DESC LIMIT 1) AS newest
                 FROM attempts a, launch_settings s
                WHERE a.fleet_id = %s AND a.prepare_deadline IS NOT NULL""",
            (self.fleet,),
        )
        for row in wrong:
            assert row["resume_artifact_id"] == row["newest"], row

    def teardown(self) -> None:
        STEPS.append(self.steps)
        RECLAIMS.append(
            self.db.fetch_one(
                "SELECT count(*) AS n FROM preemptions WHERE fleet_id = %s AND rule = 'reclaim'",
                (self.fleet,),
            )["n"]
        )


def _model_settings(max_examples: int, steps: int) -> settings:
    return settings(
        max_examples=max_examples,
        stateful_step_count=steps,
        deadline=None,
        derandomize=True,
        suppress_health_check=list(HealthCheck),
        database=None,
        # Examples share one database (a fleet each), so a replay is not bit-identical: no shrinking;
        # a failure is reported with the steps of the example that broke a promise.
        phases=[Phase.explicit, Phase.generate],
    )


def _run_model(model: type[RuleBasedStateMachine], db: Database, max_examples: int, steps: int) -> None:
    """Run a model over the test's database, its step and decision counts starting from zero."""
    model.db = db  # type: ignore[attr-defined]
    for counts in (STEPS, RACES, RECLAIMS, CHECKED):
        counts.clear()
    run_state_machine_as_test(model, settings=_model_settings(max_examples=max_examples, steps=steps))


def test_launch_state_machine_keeps_its_promises(db: Database, capsys: pytest.CaptureFixture) -> None:
    _run_model(LaunchModel, db, max_examples=60, steps=50)
    with capsys.disabled():
        print(
            f"\nlaunch model: {len(STEPS)} examples, {sum(STEPS)} steps (invariants checked after each), "
            f"{sum(RACES)} START(s) raced a reconcile list, {sum(RECLAIMS)} reclaim decision(s), "
            f"{len(CHECKED)} pass(es) checked a job within its guarantee against lent GPUs"
        )
    # (the reconcile race itself is pinned down by tests/isolation/reconcile_start.spec)
    assert sum(STEPS) > 1000


class ReclaimModel(TeamChecks, RuleBasedStateMachine):
    """Teams, guarantees, borrowing and preemption alone, so that reclaims happen in many examples: two
    teams guaranteed 4 (limit 6) and 2 of 8 GPUs, jobs placed and started as soon as a pass reserves them (the
    launch protocol is the other model's subject), ending or stopping when asked at random. The same
    checks as LaunchModel's for teams and preemption, after every pass and step, and no loop: an attempt
    of a team within its guarantee at the time is never a reclaim victim."""

    db: Database
    guarantees = (4, 2)

    def __init__(self) -> None:
        super().__init__()
        n = next(_fleets)
        self.fleet = make_fleet(self.db, f"reclaim{n}")
        for i in range(4):
            make_node(self.db, self.fleet, f"r{n}n{i}", gpus=2)
        self.user = make_user(self.db, f"ru{n}")
        admin = make_user(self.db, f"ra{n}", "admin")
        self.teams = [make_team(self.db, self.user, f"rta{n}"), make_team(self.db, self.user, f"rtb{n}")]
        set_quota(self.db, admin, self.teams[0], self.fleet, guaranteed=self.guarantees[0], limit=6, weight=1)
        set_quota(self.db, admin, self.teams[1], self.fleet, guaranteed=self.guarantees[1], weight=2)
        self.db.fetch_all("UPDATE preemption_settings SET min_runtime = interval '0' RETURNING 1")

    @rule(
        team=st.sampled_from([0, 1]),
        count=st.integers(1, 4),
        nodes=st.sampled_from([1, 1, 2]),
        gpus=st.integers(1, 2),
        preemptible=st.sampled_from([True, True, False]),
        priority=st.sampled_from([0, 0, 0, 50]),
        max_preemptions=st.sampled_from([1, 2]),
    )
    def submit(
        self,
        team: int,
        count: int,
        nodes: int,
        gpus: int,
        preemptible: bool,
        priority: int,
        max_preemptions: int,
    ) -> None:
        """A team submits `count` jobs of one shape (teams submit in bursts, so fleets fill up); the
        scheduler, woken, runs a pass."""
        for _ in range(count):
            self._submit(team, nodes, gpus, 2, preemptible, priority, max_preemptions)
        self.place_and_start()

    @rule()
    def place_and_start(self) -> None:
        """A pass; every attempt it reserved is prepared and started (simulated agents, epoch 0)."""
        self.db.fetch_all(  # the simulated agents heartbeat before every pass
            "UPDATE nodes SET last_heartbeat_at = now() WHERE fleet_id = %s RETURNING id", (self.fleet,)
        )
        self._reserve_checked()
        for row in self.db.fetch_all(
            "SELECT job_id FROM attempts WHERE fleet_id = %s AND state = 'reserved' ORDER BY id",
            (self.fleet,),
        ):
            run_to_running(self.db, row["job_id"])

    def _running(self, asked: bool) -> list[int]:
        return [
            r["id"]
            for r in self.db.fetch_all(
                """SELECT id FROM attempts WHERE fleet_id = %s AND state = 'running'
                      AND (stop_kind IS NOT NULL) = %s ORDER BY id""",
                (self.fleet, asked),
            )
        ]

    def _exit(self, attempt_id: int) -> None:
        for member in self.db.fetch_all(
            "SELECT * FROM members WHERE attempt_id = %s AND state IN ('starting', 'running') ORDER BY id",
            (attempt_id,),
        ):
            report(self.db, "member_exited", member, exit_code=0)

    @rule(data=st.data())
    def a_job_ends(self, data: st.DataObject) -> None:
        running = self._running(asked=False)
        if running:
            self._exit(data.draw(st.sampled_from(running)))
            self.place_and_start()  # the GPUs it released wake the scheduler

    @rule(data=st.data())
    def a_victim_stops(self, data: st.DataObject) -> None:
        asked = self._running(asked=True)
        if asked:
            self._exit(data.draw(st.sampled_from(asked)))
            self.place_and_start()

    @invariant()
    def teams_and_preemption_keep_their_promises(self) -> None:
        STEPS.append(1)
        self._victims_outranked_or_reclaimed()
        assert_team_held_counted(self.db, [self.fleet])
        # No loop: the attempt a reclaimer got is never itself reclaimed (its team held no more than its
        # guarantee when it was placed, and a team lends only its newest attempts above its guarantee).
        back = self.db.fetch_all(
            """SELECT first.id AS reclaim, again.id AS reclaimed_by FROM preemptions first
                 JOIN attempts a ON a.job_id = first.preemptor_job_id AND a.created_at >= first.created_at
                 JOIN preemption_victims v ON v.attempt_id = a.id
                 JOIN preemptions again ON again.id = v.preemption_id AND again.rule = 'reclaim'
                WHERE first.fleet_id = %s AND first.rule = 'reclaim'""",
            (self.fleet,),
        )
        assert not back, f"a reclaimer's attempt was reclaimed: {back}"
        limit = self.db.fetch_one(
            "SELECT limit_gpus FROM team_quotas WHERE team_id = %s AND fleet_id = %s",
            (self.teams[0], self.fleet),
        )["limit_gpus"]
        assert self._team_gpus().get(self.teams[0], 0) <= limit

    def teardown(self) -> None:
        RECLAIMS.append(
            self.db.fetch_one(
                "SELECT count(*) AS n FROM preemptions WHERE fleet_id = %s AND rule = 'reclaim'",
                (self.fleet,),
            )["n"]
        )


def test_reclaim_model_keeps_its_promises(db: Database, capsys: pytest.CaptureFixture) -> None:
    _run_model(ReclaimModel, db, max_examples=80, steps=40)
    with capsys.disabled():
        print(
            f"\nreclaim model: {len(STEPS)} steps, {sum(RECLAIMS)} reclaim decision(s), "
            f"{len(CHECKED)} pass(es) checked a job within its guarantee against lent GPUs"
        )
    assert sum(RECLAIMS) > 0, "no example reclaimed anything: the model no longer exercises the rule"


class EqualPriorityModel(ReclaimModel):
    """Issue 21's "two equal-priority teams never preempt each other": the reclaim model's fleet and teams
    without guarantees (weights only: nothing is lent, so nothing may be reclaimed) and every job of
    priority 0, preemptible or not. However full the fleet and long the queue, no preemption at all."""

    guarantees = (0, 0)

    @rule(
        team=st.sampled_from([0, 1]),
        count=st.integers(1, 4),
        nodes=st.sampled_from([1, 1, 2]),
        gpus=st.integers(1, 2),
        max_preemptions=st.sampled_from([1, 2]),
    )
    def submit(self, team: int, count: int, nodes: int, gpus: int, max_preemptions: int) -> None:
        ReclaimModel.submit(self, team, count, nodes, gpus, True, 0, max_preemptions)

    @invariant()
    def no_preemption_at_all(self) -> None:
        made = self.db.fetch_all("SELECT id, rule FROM preemptions WHERE fleet_id = %s", (self.fleet,))
        assert made == [], made
        asked = self.db.fetch_all(
            "SELECT id, stop_kind FROM attempts WHERE fleet_id = %s AND stop_kind IS NOT NULL", (self.fleet,)
        )
        assert asked == [], asked


def test_two_equal_priority_teams_never_preempt_each_other(db: Database) -> None:
    _run_model(EqualPriorityModel, db, max_examples=30, steps=30)
    assert sum(STEPS) > 200
