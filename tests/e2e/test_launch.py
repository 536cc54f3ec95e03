"""Launch end to end: real agents, a real gateway, real workers and runners, real torch.distributed.

Each test builds a small cluster (tests/e2e/launch_cluster.py) and drives jobs through submission; what
the tests check is what the database and the processes on the machine say afterwards.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from tests.e2e.launch_cluster import MIB, Cluster
from tests.helpers import wait_for
from tuneplane.app.security import token_hash
from tuneplane.workers.proctree import tagged

pytestmark = pytest.mark.e2e

TRAIN = """
import json, os, sys, torch, torch.distributed as dist
dist.init_process_group("gloo")
value = torch.tensor([float(dist.get_rank() + 1)])
dist.all_reduce(value)
seen = {k: os.environ.get(k) for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT",
        "TUNEPLANE_JOB_ID", "TUNEPLANE_ATTEMPT", "TUNEPLANE_MEMBER_RANK", "TUNEPLANE_OUTPUT_DIR",
        "TUNEPLANE_TELEMETRY_TOKEN", "TUNEPLANE_DATABASE_URL", "TUNEPLANE_ENROLL_TOKEN")}
seen["sum"] = value.item()
seen["credential_visible"] = [k for k, v in os.environ.items() if v.startswith("tpn_")]
out = os.environ["TUNEPLANE_OUTPUT_DIR"]
with open(os.path.join(out, "metrics.jsonl"), "w") as f:
    f.write(json.dumps({"step": 1, "loss": 1.0 / (dist.get_rank() + 1)}) + "\\n")
with open(os.path.join(out, "seen.json"), "w") as f:
    json.dump(seen, f)
print("rank", dist.get_rank(), "sum", value.item(), flush=True)
dist.destroy_process_group()
"""

WAIT_FOR_RELEASE = """
import os, pathlib, time
flag = pathlib.Path(os.environ["RELEASE_FLAG"])
pathlib.Path(os.environ["TUNEPLANE_OUTPUT_DIR"], "started").write_text(str(os.getpid()))
while not flag.exists():
    time.sleep(0.1)
print("released", flush=True)
"""


def _resources(nodes: int = 2) -> dict:
    return {"nodes": nodes, "gpus_per_node": 0, "cpus_per_node": 1, "memory_per_node": 64 * MIB}


def test_two_member_torchrun_job_rendezvouses_across_two_agents_and_succeeds(cluster: Cluster) -> None:
    telemetry = cluster.start_telemetry_gateway()
    cluster.start_agent("a", "--telemetry-url", telemetry)
    cluster.start_agent("b", "--telemetry-url", telemetry)
    cluster.start_worker()
    archive = cluster.upload_source({"train.py": TRAIN})
    job_id = cluster.submit(
        {
            "source": {"archive": archive, "entrypoint": "python train.py", "integration": "torchrun"},
            "resources": _resources(2),
            "env": {"OMP_NUM_THREADS": "1"},
        }
    )
    job = cluster.wait_job(job_id, ("succeeded", "failed", "cancelled"), timeout=90)
    assert job["state"] == "succeeded", cluster.diagnose(job_id)
    members = cluster.members(job_id)
    assert [(m["rank"], m["state"], m["exit_code"]) for m in members] == [(0, "exited", 0), (1, "exited", 0)]
    assert {m["node"] for m in members} == {"a", "b"}
    seen = {}
    for m in members:
        seen[m["rank"]] = json.loads(
            (cluster.member_dir(m["node"], m["id"]) / "output" / "seen.json").read_text()
        )
    # Each member saw its own rank, the same world size and rendezvous, and the all_reduce joined them.
    assert [seen[r]["TUNEPLANE_MEMBER_RANK"] for r in (0, 1)] == ["0", "1"]
    assert {seen[r]["WORLD_SIZE"] for r in (0, 1)} == {"2"}
    assert len({(seen[r]["MASTER_ADDR"], seen[r]["MASTER_PORT"]) for r in (0, 1)}) == 1
    assert [seen[r]["sum"] for r in (0, 1)] == [3.0, 3.0]
    assert {seen[r]["TUNEPLANE_JOB_ID"] for r in (0, 1)} == {str(job_id)}
    # Only the narrow telemetry scope, never the node credential, the enrollment token or the database.
    for r in (0, 1):
        assert seen[r]["TUNEPLANE_DATABASE_URL"] is None and seen[r]["TUNEPLANE_ENROLL_TOKEN"] is None
        assert seen[r]["credential_visible"] == []
    stdout = (cluster.member_dir(members[0]["node"], members[0]["id"]) / "logs" / "stdout.log").read_text()
    assert "sum 3.0" in stdout
    assert cluster.held() == 0
    # Each member's collector shipped that member's metrics with a token scoped to it (revoked once the
    # collector drained: the member's metrics are complete).
    for r in (0, 1):
        scope = cluster.db.fetch_one(
            "SELECT job_id, attempt, member_rank, revoked_at FROM telemetry_tokens WHERE token_hash = %s",
            (token_hash(seen[r]["TUNEPLANE_TELEMETRY_TOKEN"]),),
        )
        assert (scope["job_id"], scope["attempt"], scope["member_rank"]) == (job_id, 1, r)
        assert scope["revoked_at"] is not None
    # Those tokens were made while the members prepared and issued at COMMIT: START said so, and no member
    # asked for another (issue 23: no token round trip between START and the runner's spawn).
    starts = cluster.db.fetch_all(
        "SELECT c.payload FROM node_commands c JOIN attempts a ON a.id = (c.payload ->> 'attempt_id')::bigint"
        " WHERE c.kind = 'start' AND a.job_id = %s",
        (job_id,),
    )
    assert [s["payload"].get("telemetry_token") for s in starts] == [True, True]
    tokens = cluster.db.fetch_one("SELECT count(*) AS n FROM telemetry_tokens WHERE job_id = %s", (job_id,))
    assert tokens["n"] == 2
    states = cluster.db.fetch_all(
        "SELECT member_rank, state FROM telemetry_members WHERE job_id = %s ORDER BY 1", (job_id,)
    )
    assert [(s["member_rank"], s["state"]) for s in states] == [(0, "complete"), (1, "complete")]
    wait_for(
        lambda: (
            cluster.db.fetch_all(
                "SELECT DISTINCT member_rank FROM telemetry_series WHERE job_id = %s AND name = 'loss'",
                (job_id,),
            ).__len__()
            == 2
        ),
        timeout=30,
        what="both members' loss series in the database",
    )
    peer = cluster.node("a")["last_peer_check"]
    assert peer["ok"] is True and peer["peers"][0]["ok"] is True


def _wait_job_spec(cluster: Cluster, flag: Path, nodes: int = 1, ignore_sigterm: bool = False) -> dict:
    script = WAIT_FOR_RELEASE
    if ignore_sigterm:
        script = "import signal\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\n" + script
    archive = cluster.upload_source({"wait.py": script})
    return {
        "source": {"archive": archive, "entrypoint": "python wait.py", "integration": "script"},
        "resources": _resources(nodes),
        "env": {"RELEASE_FLAG": str(flag)},
    }


def _member_tag(cluster: Cluster, agent: str, member_id: int) -> str:
    from tuneplane.workers.agent.directories import AgentPaths
    from tuneplane.workers.agent.member_records import member_tag

    state, work = cluster.agent_dirs(agent)
    return member_tag(AgentPaths(state.resolve(), work.resolve()), member_id)


def _started(cluster: Cluster, member: dict) -> bool:
    return (cluster.member_dir(member["node"], member["id"]) / "output" / "started").exists()


def _commands(cluster: Cluster, kind: str, member_id: int) -> list[dict]:
    return cluster.db.fetch_all(
        "SELECT * FROM node_commands WHERE kind = %s AND payload ->> 'member_id' = %s", (kind, str(member_id))
    )


def test_one_members_failed_prepare_aborts_the_launch_and_nothing_starts_anywhere(cluster: Cluster) -> None:
    cluster.start_agent("a")
    # b tells peers an address its probe does not listen on: rank 0 cannot reach it.
    cluster.start_agent("b", "--probe-host", "127.0.0.1", "--advertise-address", "127.0.0.3")
    cluster.start_worker()
    job_id = cluster.submit(_wait_job_spec(cluster, cluster.root / "never", nodes=2))
    job = cluster.wait_job(job_id, ("failed", "succeeded", "cancelled"), timeout=60)
    assert job["state"] == "failed", cluster.diagnose(job_id)
    assert "failed to prepare" in job["state_reason"] and "cannot reach rank 1 on b" in job["state_reason"]
    members = cluster.members(job_id)
    assert {m["state"] for m in members} == {"aborted"}
    # Launched 1 + launch_settings.free_relaunches (2) times: an abort in prepare started nothing (0140).
    assert len({m["attempt_id"] for m in members}) == 3
    assert cluster.db.fetch_one(
        "SELECT decision FROM launch_decisions WHERE attempt_id = %s", (members[0]["attempt_id"],)
    ) == {"decision": "abort"}
    assert cluster.held() == 0
    # Nothing was started on any node: no START was ever sent, no runner ran, workspaces are gone.
    for m in members:
        assert _commands(cluster, "start", m["id"]) == []
        wait_for(
            lambda m=m: not cluster.member_dir(m["node"], m["id"]).exists(),
            timeout=10,
            what=f"workspace of member {m['id']} removed",
        )
        assert m["started_at"] is None and m["pid"] is None
    assert cluster.node("a")["last_peer_check"]["ok"] is False
    # b may have been told to abort before its own prepare finished; if it reported, its check passed.
    b_check = cluster.node("b")["last_peer_check"]
    assert b_check is None or b_check["ok"] is True


def test_killed_agent_leaves_its_member_running_contact_lost_and_held_until_the_restarted_agent_reconciles(
    cluster: Cluster,
) -> None:
    agent = cluster.start_agent("a")
    cluster.start_worker()
    flag = cluster.root / "release"
    job_id = cluster.submit(_wait_job_spec(cluster, flag))
    (member,) = cluster.wait_members(job_id, "running")
    wait_for(lambda: _started(cluster, member), timeout=20, what="workload started")
    tag = _member_tag(cluster, "a", member["id"])
    cluster.kill9(agent)
    (member,) = cluster.wait_contact_lost(job_id)
    assert member["state"] == "running" and "lost contact" in member["reason"]
    assert member["released_at"] is None
    assert cluster.held() == 1
    assert tagged(tag), "the workload must survive its agent's crash"
    assert cluster.job(job_id)["state"] == "running"

    cluster.start_agent("a", enroll=False)
    (member,) = wait_for(
        lambda: [m for m in cluster.members(job_id) if m["contact_lost_at"] is None],
        timeout=20,
        what="contact restored by the reconcile",
    )
    assert member["state"] == "running" and "reconnected" in member["reason"]
    flag.write_text("go")
    job = cluster.wait_job(job_id, ("succeeded", "failed"), timeout=30)
    assert job["state"] == "succeeded", cluster.diagnose(job_id)
    assert cluster.held() == 0
    assert _commands(cluster, "start", member["id"]).__len__() == 1


def test_fencing_a_lost_node_releases_its_resources_and_its_returning_agent_kills_the_orphan(
    cluster: Cluster,
) -> None:
    agent = cluster.start_agent("a")
    cluster.start_worker()
    job_id = cluster.submit(_wait_job_spec(cluster, cluster.root / "never"))
    (member,) = cluster.wait_members(job_id, "running")
    wait_for(lambda: _started(cluster, member), timeout=20, what="workload started")
    tag = _member_tag(cluster, "a", member["id"])
    cluster.kill9(agent)
    cluster.wait_contact_lost(job_id)
    assert cluster.held() == 1
    cluster.db.call("fence_node", "gpu/a", "e2e: declared dead", "user:test")
    (member,) = cluster.members(job_id)
    assert member["state"] == "lost" and member["released_at"] is not None
    assert cluster.held() == 0
    assert cluster.job(job_id)["state"] == "failed"
    assert tagged(tag), "fencing changes the database, not the machine"

    cluster.start_agent("a", enroll=False)
    wait_for(lambda: not tagged(tag), timeout=20, what="the returning agent killed its orphan")
    assert cluster.members(job_id)[0]["state"] == "lost"
    kills = cluster.db.fetch_all("SELECT payload FROM node_commands WHERE kind = 'kill'")
    assert [k["payload"]["member_ids"] for k in kills] == [[member["id"]]]


def test_worker_killed_mid_prepare_is_replaced_and_no_member_starts_twice(cluster: Cluster) -> None:
    cluster.start_agent("a")
    cluster.start_agent("b")
    first = cluster.start_worker("--hold-before-prepare", "120", "--name", "first")
    flag = cluster.root / "release"
    flag.write_text("go")  # the workload ends as soon as it starts
    job_id = cluster.submit(_wait_job_spec(cluster, flag, nodes=2))
    first.wait_line("holding")
    attempt = cluster.db.fetch_one("SELECT * FROM attempts WHERE job_id = %s", (job_id,))
    assert attempt["state"] == "reserved" and attempt["launch_owner"] == "first"
    cluster.kill9(first)
    cluster.start_worker("--name", "second")
    job = cluster.wait_job(job_id, ("succeeded", "failed"), timeout=60)
    assert job["state"] == "succeeded", cluster.diagnose(job_id)
    attempt = cluster.db.fetch_one("SELECT * FROM attempts WHERE job_id = %s", (job_id,))
    # The first worker may have claimed twice before it died (the launch its own placement pass started
    # directly, and the queued launch job); either way the second took over with a newer epoch.
    assert attempt["launch_owner"] == "second" and attempt["launch_epoch"] >= 2
    for m in cluster.members(job_id):
        assert len(_commands(cluster, "prepare", m["id"])) == 1
        assert len(_commands(cluster, "start", m["id"])) == 1
        runner_log = (cluster.member_dir(m["node"], m["id"]) / "logs" / "runner.log").read_text()
        assert runner_log.count("starting member") == 1


def test_cancel_while_preparing_ends_the_prepare_removes_the_workspace_and_releases(cluster: Cluster) -> None:
    cluster.start_agent("a", "--hold-prepare", "60")
    cluster.start_worker()
    job_id = cluster.submit(_wait_job_spec(cluster, cluster.root / "never"))
    (member,) = cluster.wait_members(job_id, "preparing")
    wait_for(lambda: cluster.member_dir("a", member["id"]).exists(), timeout=10, what="prepare began")
    # A long preparation does not stop the agent's heartbeats.
    before = cluster.node("a")["last_heartbeat_at"]
    wait_for(lambda: cluster.node("a")["last_heartbeat_at"] > before, timeout=5, what="a heartbeat")
    assert cluster.node("a")["connectivity"] == "connected"
    cluster.db.call("cancel_job", job_id, cluster.user_id, "e2e")
    job = cluster.wait_job(job_id, ("cancelled",), timeout=10)
    assert job["state"] == "cancelled"
    assert cluster.held() == 0
    wait_for(lambda: not cluster.member_dir("a", member["id"]).exists(), timeout=10, what="workspace removed")
    assert _commands(cluster, "start", member["id"]) == []
    assert not tagged(_member_tag(cluster, "a", member["id"]))


def test_cancel_while_running_stops_every_process_then_releases(cluster: Cluster) -> None:
    cluster.start_agent("a")
    cluster.start_agent("b")
    cluster.start_worker()
    # The workload ignores SIGTERM: the agent must SIGKILL it after the grace period.
    job_id = cluster.submit(_wait_job_spec(cluster, cluster.root / "never", nodes=2, ignore_sigterm=True))
    members = cluster.wait_members(job_id, "running")
    for m in members:
        wait_for(lambda m=m: _started(cluster, m), timeout=20, what="workload started")
    tags = [_member_tag(cluster, m["node"], m["id"]) for m in members]
    assert all(tagged(t) for t in tags)
    cluster.db.call("cancel_job", job_id, cluster.user_id, "e2e")
    assert cluster.held() == 2, "resources go back only once the nodes confirm"
    job = cluster.wait_job(job_id, ("cancelled",), timeout=30)
    assert job["state"] == "cancelled"
    assert cluster.held() == 0
    assert not any(tagged(t) for t in tags)
    for m in cluster.members(job_id):
        assert m["state"] == "cancelled" and m["exit_code"] < 0  # killed by a signal
        pid = int((cluster.member_dir(m["node"], m["id"]) / "output" / "started").read_text())
        assert not os.path.exists(f"/proc/{pid}") or "Z" in Path(f"/proc/{pid}/stat").read_text().split()[2]


def test_agent_killed_mid_prepare_prepares_again_after_restart_and_the_job_runs(cluster: Cluster) -> None:
    agent = cluster.start_agent("a", "--hold-prepare", "60")
    cluster.start_worker()
    flag = cluster.root / "release"
    flag.write_text("go")
    job_id = cluster.submit(_wait_job_spec(cluster, flag))
    agent.wait_line("holding the prepare")
    cluster.kill9(agent)
    restarted = cluster.start_agent("a", enroll=False)
    restarted.wait_line("preparing again")
    job = cluster.wait_job(job_id, ("succeeded", "failed"), timeout=40)
    assert job["state"] == "succeeded", cluster.diagnose(job_id)
    (member,) = cluster.members(job_id)
    assert len(_commands(cluster, "prepare", member["id"])) == 1
    assert len(_commands(cluster, "start", member["id"])) == 1


def test_a_killed_workers_launch_is_taken_over_within_its_documented_bound(cluster: Cluster) -> None:
    """docs/operations.md: a worker killed mid-launch is taken over within --heartbeat-timeout plus
    max(--poll-interval, 0.5 s), wherever in the launch it died (here: its capsule built, PREPARE not
    yet sent, its pgqueuer job picked)."""
    heartbeat, poll = 5.0, 0.3
    cluster.start_agent("a")
    first = cluster.start_worker("--hold-before-prepare", "120", "--name", "first",
                                 "--heartbeat-timeout", str(heartbeat))  # fmt: skip
    flag = cluster.root / "release"
    flag.write_text("go")
    job_id = cluster.submit(_wait_job_spec(cluster, flag))
    first.wait_line("holding")
    wait_for(
        lambda: (
            cluster.db.fetch_one(
                "SELECT count(*) AS n FROM public.pgqueuer WHERE entrypoint = 'launch' AND status = 'picked'"
            )["n"]
            == 1
        ),
        timeout=20,
        what="the first worker picked its launch job",
    )
    cluster.start_worker("--name", "second", "--heartbeat-timeout", str(heartbeat))
    cluster.kill9(first)
    killed = time.monotonic()
    wait_for(
        lambda: (
            cluster.db.fetch_one("SELECT launch_owner FROM attempts WHERE job_id = %s", (job_id,))[
                "launch_owner"
            ]
            == "second"
        ),
        timeout=60,
        interval=0.1,
        what="the second worker took the launch over",
    )
    took = time.monotonic() - killed
    # The documented bound, plus 2 s for a loaded two-core CI machine (claim and process start-up).
    assert took <= heartbeat + max(poll, 0.5) + 2.0, took
    assert cluster.wait_job(job_id, ("succeeded", "failed"), timeout=60)["state"] == "succeeded"
