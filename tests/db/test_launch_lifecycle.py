from __future__ import annotations

import json

import pytest

from tests.launch_fixtures import (
    assert_no_gpu_allocated_twice,
    job,
    make_fleet,
    make_job,
    make_node,
    make_user,
    members_of,
    report,
    run_to_running,
)
from tuneplane.app.db import Database
from tuneplane.app.errors import Refusal


@pytest.fixture
def setup(db: Database) -> dict:
    user = make_user(db)
    admin = make_user(db, "root", "admin")
    fleet_id = make_fleet(db)
    nodes = [make_node(db, fleet_id, f"n{i}", gpus=4) for i in range(2)]
    return {"user": user, "admin": admin, "fleet": fleet_id, "nodes": nodes}


def _launch(db: Database, setup: dict, **kw) -> tuple[int, dict]:
    job_id = make_job(db, setup["user"], setup["fleet"], **kw)
    db.call("reserve_next", setup["fleet"], 1000)
    attempt = db.fetch_one("SELECT * FROM attempts WHERE job_id = %s ORDER BY number DESC LIMIT 1", (job_id,))
    return job_id, attempt


def _commands(db: Database, kind: str) -> list[dict]:
    return db.fetch_all("SELECT * FROM node_commands WHERE kind = %s ORDER BY id", (kind,))


def _held(db: Database) -> int:
    return db.fetch_one("SELECT count(*) AS n FROM members WHERE released_at IS NULL")["n"]


def test_commit_only_after_every_member_prepared_then_start_once(db: Database, setup: dict) -> None:
    job_id, attempt = _launch(db, setup, nodes=2, gpus_per_node=2)
    epoch = db.call("claim_launch", attempt["id"], "w1")[0]["epoch"]
    assert db.call("begin_prepare", attempt["id"], epoch, "a" * 64)[0]["begin_prepare"] == "preparing"
    assert len(_commands(db, "prepare")) == 2
    m0, m1 = members_of(db, job_id)
    assert report(db, "member_prepared", m0)["member_prepared"]["committed"] is False
    assert _commands(db, "start") == []
    assert report(db, "member_prepared", m1)["member_prepared"]["committed"] is True
    assert report(db, "member_prepared", m1)["member_prepared"]["ignored"] is True  # duplicate report
    assert len(_commands(db, "start")) == 2
    assert db.fetch_one("SELECT decision FROM launch_decisions WHERE attempt_id = %s", (attempt["id"],)) == {
        "decision": "commit"
    }
    assert job(db, job_id)["state"] == "running"
    for m in (m0, m1):
        report(db, "member_started", m, pid=10)
    assert "all 2 member(s) running" in job(db, job_id)["state_reason"]
    for m in (m0, m1):
        report(db, "member_exited", m, exit_code=0)
    assert job(db, job_id)["state"] == "succeeded"
    assert _held(db) == 0


def test_worker_with_a_stale_epoch_is_refused_and_a_rerun_sends_nothing_twice(
    db: Database, setup: dict
) -> None:
    _job_id, attempt = _launch(db, setup)
    old = db.call("claim_launch", attempt["id"], "w1")[0]["epoch"]
    new = db.call("claim_launch", attempt["id"], "w2")[0]["epoch"]
    with pytest.raises(Refusal) as err:
        db.call("begin_prepare", attempt["id"], old, "a" * 64)
    assert err.value.status == 409 and "taken over" in err.value.message
    db.call("begin_prepare", attempt["id"], new, "a" * 64)
    again = db.call("claim_launch", attempt["id"], "w3")[0]["epoch"]
    assert db.call("begin_prepare", attempt["id"], again, "a" * 64)[0]["begin_prepare"] == "preparing"
    assert len(_commands(db, "prepare")) == 1


def test_one_failed_prepare_aborts_nothing_starts_and_resources_are_released(
    db: Database, setup: dict
) -> None:
    job_id, attempt = _launch(db, setup, nodes=2, gpus_per_node=4)
    epoch = db.call("claim_launch", attempt["id"], "w")[0]["epoch"]
    db.call("begin_prepare", attempt["id"], epoch, "a" * 64)
    m0, m1 = members_of(db, job_id)
    report(db, "member_prepared", m0)
    report(db, "member_prepare_failed", m1, reason="peer network check failed: n0:29500 unreachable")
    # A late PREPARED from the other node changes nothing: the decision is final.
    report(db, "member_prepared", m1)
    assert db.fetch_one("SELECT decision FROM launch_decisions")["decision"] == "abort"
    assert _commands(db, "start") == []
    assert len(_commands(db, "abort")) == 2
    assert _held(db) == 0
    j = job(db, job_id)
    # Nothing started: the job is launched again without spending its one attempt (0140).
    assert j["state"] == "queued" and "peer network check failed" in j["state_reason"]
    assert "does not count against max_attempts" in j["state_reason"]
    with pytest.raises(Exception, match="immutable"), db.transaction() as conn:
        conn.execute("UPDATE launch_decisions SET decision = 'commit'")


def test_prepare_deadline_aborts(db: Database, setup: dict) -> None:
    job_id, attempt = _launch(db, setup)
    epoch = db.call("claim_launch", attempt["id"], "w")[0]["epoch"]
    db.call("begin_prepare", attempt["id"], epoch, "a" * 64)
    db.fetch_all("UPDATE attempts SET prepare_deadline = now() - interval '1 second' RETURNING id")
    assert db.call("expire_prepare_deadlines")[0]["expire_prepare_deadlines"] == 1
    assert "prepare deadline passed" in job(db, job_id)["state_reason"]
    assert _held(db) == 0


def _abort_in_prepare(db: Database, job_id: int, why: str) -> None:
    """Place the job, send PREPARE, and have rank 0's node fail its prepare with `why`."""
    attempt = db.fetch_one("SELECT * FROM attempts WHERE job_id = %s ORDER BY number DESC LIMIT 1", (job_id,))
    epoch = db.call("claim_launch", attempt["id"], "w")[0]["epoch"]
    db.call("begin_prepare", attempt["id"], epoch, "a" * 64)
    (m,) = [m for m in members_of(db, job_id) if m["attempt_id"] == attempt["id"]]
    report(db, "member_prepare_failed", m, reason=why)


def test_a_launch_aborted_in_prepare_is_relaunched_free_a_bounded_number_of_times(
    db: Database, setup: dict
) -> None:
    """Rank 0 cannot bind MASTER_PORT (something else holds it): nothing started, so max_attempts 1 is not
    spent; each re-launch is a new attempt with another rendezvous port; after launch_settings.
    free_relaunches free ones, an abort counts and the job fails with the reason."""
    job_id, _ = _launch(db, setup, max_attempts=1)
    ports = []
    for round_ in range(3):
        if round_:
            db.call("reserve_next", setup["fleet"], 1000)
        attempt = db.fetch_one(
            "SELECT * FROM attempts WHERE job_id = %s ORDER BY number DESC LIMIT 1", (job_id,)
        )
        ports.append(attempt["master_port"])
        _abort_in_prepare(db, job_id, f"rank 0 cannot bind MASTER_PORT {attempt['master_port']} (in use)")
        j = job(db, job_id)
        if round_ < 2:
            assert j["state"] == "queued", j
            assert f"free re-launch {round_ + 1} of 2" in j["state_reason"]
            assert j["free_relaunches_used"] == round_ + 1
    assert len(set(ports)) == 3, ports
    assert j["state"] == "failed" and "attempt 1 of 1 failed" in j["state_reason"], j
    assert "cannot bind MASTER_PORT" in j["state_reason"]
    assert _held(db) == 0
    # A failure after free re-launches counts against max_attempts like any other.
    job2, _ = _launch(db, setup, max_attempts=2)
    _abort_in_prepare(db, job2, "rank 0 cannot bind MASTER_PORT")
    db.call("reserve_next", setup["fleet"], 1000)
    (m,) = run_to_running(db, job2)
    report(db, "member_exited", m, exit_code=3)
    j2 = job(db, job2)
    assert j2["state"] == "queued" and "attempt 1 of 2 failed" in j2["state_reason"], j2
    # free_relaunches 0 restores the old rule: an abort in prepare counts.
    db.fetch_all("UPDATE launch_settings SET free_relaunches = 0 RETURNING 1")
    job3, _ = _launch(db, setup, max_attempts=1)
    _abort_in_prepare(db, job3, "rank 0 cannot bind MASTER_PORT")
    assert job(db, job3)["state"] == "failed"


def test_failed_attempt_is_retried_until_max_attempts(db: Database, setup: dict) -> None:
    job_id, _ = _launch(db, setup, max_attempts=2)
    (m,) = run_to_running(db, job_id)
    report(db, "member_exited", m, exit_code=3)
    j = job(db, job_id)
    assert j["state"] == "queued" and "attempt 1 of 2 failed" in j["state_reason"]
    assert "exited with status 3" in j["state_reason"]
    db.call("reserve_next", setup["fleet"], 1000)
    (m2,) = [m for m in members_of(db, job_id) if m["attempt"] == 2]
    run_to_running(db, job_id)
    report(db, "member_exited", m2, exit_code=1)
    assert job(db, job_id)["state"] == "failed"


def test_one_member_failing_stops_the_others_and_releases_only_after_they_confirm(
    db: Database, setup: dict
) -> None:
    job_id, _ = _launch(db, setup, nodes=2)
    m0, m1 = run_to_running(db, job_id)
    report(db, "member_exited", m1, exit_code=2)
    assert [c["payload"]["member_id"] for c in _commands(db, "stop")] == [m0["id"]]
    assert _held(db) == 1 and job(db, job_id)["state"] == "running"
    report(db, "member_exited", m0, exit_code=-15)
    assert job(db, job_id)["state"] == "failed" and _held(db) == 0


@pytest.mark.parametrize("phase", ["queued", "reserved", "preparing", "running"])
def test_cancel_in_every_phase_ends_cancelled_with_resources_released(
    db: Database, setup: dict, phase: str
) -> None:
    job_id = make_job(db, setup["user"], setup["fleet"], nodes=2)
    members: list[dict] = []
    if phase != "queued":
        db.call("reserve_next", setup["fleet"], 1000)
    if phase == "preparing":
        attempt = db.fetch_one("SELECT id FROM attempts WHERE job_id = %s", (job_id,))
        epoch = db.call("claim_launch", attempt["id"], "w")[0]["epoch"]
        db.call("begin_prepare", attempt["id"], epoch, "a" * 64)
    if phase == "running":
        members = run_to_running(db, job_id)
    db.call("cancel_job", job_id, setup["user"], "changed my mind")
    if phase == "running":
        # Still held until the nodes confirm the members stopped.
        assert (
            job(db, job_id)["state"] == "running"
            and "waiting for 2 member(s) to stop" in job(db, job_id)["state_reason"]
        )
        assert len(_commands(db, "stop")) == 2 and _held(db) == 2
        for m in members:
            report(db, "member_exited", m, exit_code=-15)
    j = job(db, job_id)
    assert j["state"] == "cancelled", j
    assert _held(db) == 0
    assert _commands(db, "start") == [] or phase == "running"


def test_cancel_of_another_users_job_is_refused(db: Database, setup: dict) -> None:
    job_id = make_job(db, setup["user"], setup["fleet"])
    other = make_user(db, "mallory")
    with pytest.raises(Refusal) as err:
        db.call("cancel_job", job_id, other, None)
    assert err.value.status == 404
    db.call("cancel_job", job_id, setup["admin"], "admin override")
    assert job(db, job_id)["state"] == "cancelled"


def test_lost_node_marks_contact_lost_keeps_state_and_resources_until_reconcile(
    db: Database, setup: dict
) -> None:
    job_id, _ = _launch(db, setup, nodes=2)
    _m0, m1 = run_to_running(db, job_id)
    db.fetch_all(
        "UPDATE nodes SET last_heartbeat_at = now() - interval '1 hour' WHERE id = %s RETURNING id",
        (m1["node_id"],),
    )
    assert db.call("sweep_lost_nodes")[0]["sweep_lost_nodes"] == 1
    members = members_of(db, job_id)
    assert [m["state"] for m in members] == ["running", "running"]
    assert [m["contact_lost_at"] is not None for m in members] == [False, True]
    assert _held(db) == 2 and job(db, job_id)["state"] == "running"
    assert db.fetch_all("SELECT member_id FROM v_uncertain") == [{"member_id": m1["id"]}]
    # The node reconnects and still runs its member.
    db.fetch_all("UPDATE nodes SET last_heartbeat_at = now() WHERE id = %s RETURNING id", (m1["node_id"],))
    result = db.call(
        "reconcile_node", m1["node_id"], 0, json.dumps({"running": [{"member_id": m1["id"], "pid": 1}]})
    )
    assert result[0]["reconcile_node"]["restored"] == 1
    members = members_of(db, job_id)
    assert [m["state"] for m in members] == ["running", "running"]
    assert [m["contact_lost_at"] for m in members] == [None, None]
    assert db.fetch_all("SELECT member_id FROM v_uncertain") == []


def test_reconnected_node_without_the_member_fails_it(db: Database, setup: dict) -> None:
    job_id, _ = _launch(db, setup)
    (m,) = run_to_running(db, job_id)
    db.fetch_all("UPDATE nodes SET last_heartbeat_at = now() - interval '1 hour' RETURNING id")
    db.call("sweep_lost_nodes")
    epoch = db.call("node_session_opened", m["node_id"], "127.0.0.1", "test")[0]["epoch"]
    db.call("reconcile_node", m["node_id"], epoch, '{"running": []}')
    j = job(db, job_id)
    assert j["state"] == "failed" and "does not run it" in j["state_reason"]
    # released, and KILLed all the same in case something of it still runs
    assert _commands(db, "kill")[-1]["payload"]["member_ids"] == [m["id"]]
    assert _held(db) == 0


def test_fence_releases_resources_and_a_returning_agent_is_told_to_kill(db: Database, setup: dict) -> None:
    job_id, _ = _launch(db, setup, nodes=2)
    m0, m1 = run_to_running(db, job_id)
    db.fetch_all(
        "UPDATE nodes SET last_heartbeat_at = now() - interval '1 hour' WHERE id = %s RETURNING id",
        (m1["node_id"],),
    )
    db.call("sweep_lost_nodes")
    fenced = db.call("fence_node", str(m1["node_id"]), "machine is dead", "ops")[0]
    assert fenced["members_lost"] == 1
    states = {m["rank"]: m["state"] for m in members_of(db, job_id)}
    assert states[1] == "lost" and states[0] == "stopping"
    assert (
        db.fetch_one("SELECT released_at FROM members WHERE id = %s", (m1["id"],))["released_at"] is not None
    )
    # The fenced node comes back still running its orphan: it gets a KILL for it.
    result = db.call(
        "reconcile_node", m1["node_id"], 0, json.dumps({"running": [{"member_id": m1["id"], "pid": 5}]})
    )
    assert result[0]["reconcile_node"]["kill"] == [m1["id"]]
    assert _commands(db, "kill")[0]["payload"]["member_ids"] == [m1["id"]]
    report(db, "member_exited", m0, exit_code=-15)
    assert job(db, job_id)["state"] == "failed" and _held(db) == 0
    # A fenced node gets no new work.
    other = make_job(db, setup["user"], setup["fleet"], nodes=2)
    assert db.call("reserve_next", setup["fleet"], 1000) == []
    assert job(db, other)["state"] == "queued"
    assert_no_gpu_allocated_twice(db)


def test_a_node_fenced_while_connected_is_unfenced_once_its_agent_acknowledged_every_kill(
    db: Database, setup: dict
) -> None:
    job_id, _ = _launch(db, setup)
    (m,) = run_to_running(db, job_id)
    node = m["node_id"]
    # Its agent is connected in session 1, reconciled: it runs the member and an orphan (KILL, unacked).
    epoch = db.call("node_session_opened", node, "127.0.0.1", "test")[0]["epoch"]
    running = [{"member_id": m["id"], "pid": 5}, {"member_id": 999999, "pid": 6}]
    db.call("reconcile_node", node, epoch, json.dumps({"running": running}))
    delivered = db.call("claim_node_commands", node, epoch, 100)
    (orphan_kill,) = [c for c in delivered if c["kind"] == "kill"]
    for c in delivered:
        if c["kind"] != "kill":
            db.call("ack_node_command", node, epoch, c["id"], "{}", None)
    db.call("fence_node", str(node), "flaky GPU", "ops")
    (fence_kill,) = [c for c in db.call("claim_node_commands", node, epoch, 100) if c["kind"] == "kill"]
    assert fence_kill["payload"]["member_ids"] == [m["id"]]

    def unfence() -> str:
        try:
            return str(db.call("unfence_node", str(node), "repaired", "ops")[0]["unfence_node"])
        except Refusal as refusal:
            assert refusal.status == 409
            return refusal.message

    assert "2 KILL command(s) are not acknowledged" in unfence()
    db.call("ack_node_command", node, epoch, fence_kill["id"], "{}", None)
    # The orphan's KILL predates the fence, and still nothing proves the orphan is gone.
    assert "1 KILL command(s) are not acknowledged" in unfence()
    db.call("ack_node_command", node, epoch, orphan_kill["id"], "{}", None)
    # Allowed in the session that was open all along: the node never had to reconnect.
    assert unfence() == "True"
    assert db.fetch_one("SELECT fenced_at FROM nodes WHERE id = %s", (node,))["fenced_at"] is None
    assert job(db, job_id)["state"] == "failed" and _held(db) == 0


def test_report_from_a_replaced_session_is_refused(db: Database, setup: dict) -> None:
    job_id, _ = _launch(db, setup)
    (m,) = run_to_running(db, job_id)
    db.fetch_all("UPDATE nodes SET session_epoch = 5 WHERE id = %s RETURNING id", (m["node_id"],))
    with pytest.raises(Refusal) as err:
        report(db, "member_exited", m, exit_code=0)
    assert err.value.status == 409
    assert job(db, job_id)["state"] == "running"


def test_an_illegal_or_unauthorised_transition_is_refused_naming_who_tried(db: Database, setup: dict) -> None:
    job_id, _attempt = _launch(db, setup)
    (member,) = members_of(db, job_id)
    assert member["state"] == "reserved"
    with pytest.raises(Refusal) as illegal:
        db.fetch_all("UPDATE members SET state = 'running' WHERE id = %s RETURNING id", (member["id"],))
    assert illegal.value.status == 409
    assert "reserved → running is not a transition" in illegal.value.message
    assert "a direct UPDATE" in illegal.value.message
    # A listed transition, but made by a function that is not its writer: the writer's name is given.
    with pytest.raises(Refusal) as unauthorised:
        db.call("set_member_state", member["id"], "preparing", "by hand")
    assert "may be made only by begin_prepare" in unauthorised.value.message
    assert "attempted by set_member_state" in unauthorised.value.message
    assert members_of(db, job_id)[0]["state"] == "reserved"
    # An operator repairing data says why, in the same transaction, and is let through.
    with db.transaction() as conn:
        conn.execute("SET LOCAL tuneplane.operator_repair = 'test: repair'")
        conn.execute("UPDATE members SET state = 'preparing' WHERE id = %s", (member["id"],))
    assert members_of(db, job_id)[0]["state"] == "preparing"


def test_nodes_nobody_reads_commands_for_get_none(db: Database, setup: dict) -> None:
    """A Slurm fleet's nodes are driven by its worker (scancel), not by an outbox: an abort queues nothing
    there, while a node agent's node still gets its command."""
    slurm = db.fetch_one("INSERT INTO fleets (name, backend) VALUES ('hpc', 'slurm') RETURNING id")["id"]
    make_node(db, slurm, "s0", gpus=2)
    for fleet in (slurm, setup["fleet"]):
        job_id = make_job(db, setup["user"], fleet)
        db.call("reserve_next", fleet, 1000)
        db.call("cancel_job", job_id, setup["admin"], "test")
        assert job(db, job_id)["state"] == "cancelled"
    kinds = db.fetch_all(
        "SELECT f.backend, c.kind FROM node_commands c JOIN nodes n ON n.id = c.node_id"
        " JOIN fleets f ON f.id = n.fleet_id"
    )
    assert kinds == [{"backend": "node", "kind": "abort"}]
