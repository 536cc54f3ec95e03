"""Launch guarantees under faults, end to end (issue 10): a real node gateway, real agents and workers,
real runners; the faults are a kill -9 of the gateway and an operator's fence.

* The gateway dies between COMMIT and START: one member's START was taken from the outbox but never
  reached its agent (a test proxy swallows it), the other's agent had spawned the runner but not yet
  recorded it nor acknowledged START (--hold-after-spawn). After the restart each member runs exactly
  once, keeps its GPU, and the queued job waiting for a GPU is placed only after the workloads ended.
* Fencing a connected node with a running member: its agent kills the workload, and unfence_node is
  refused until the agent acknowledged that KILL (by then nothing of the member runs).

The no-zombie acceptance item (20 jobs) is tests/e2e/test_member_end.py::
test_no_zombie_under_the_agent_after_20_jobs.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import psutil
import pytest

from tests.e2e.launch_cluster import MIB, Cluster
from tests.e2e.node_processes import zombies_under
from tests.e2e.outage_proxy import OutageProxy
from tests.helpers import wait_for
from tuneplane.app.errors import Refusal
from tuneplane.workers.agent.directories import AgentPaths
from tuneplane.workers.agent.member_records import member_tag
from tuneplane.workers.proctree import alive, tagged
from tuneplane.workers.runner.process import read_runner_pids

pytestmark = pytest.mark.e2e

# Appends one line per run (a second run of the member would show), waits for the release flag, writes
# when it ended.
RUN_ONCE = """
import os, pathlib, signal, time
if os.environ.get("IGNORE_SIGTERM"):
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
out = pathlib.Path(os.environ["TUNEPLANE_OUTPUT_DIR"])
with open(out / "runs", "a") as f:
    f.write(f"{os.getpid()}\\n")
flag = pathlib.Path(os.environ["RELEASE_FLAG"])
while not flag.exists():
    time.sleep(0.05)
(out / "ended").write_text(repr(time.time()))
"""


def _spec(archive: str, flag: Path, nodes: int, gpus: int = 1, **env: str) -> dict:
    return {
        "source": {"archive": archive, "entrypoint": "python job.py", "integration": "script"},
        "resources": {"nodes": nodes, "gpus_per_node": gpus, "cpus_per_node": 1, "memory_per_node": 64 * MIB},
        "env": {"RELEASE_FLAG": str(flag), **env},
    }


def _output(cluster: Cluster, member: dict, name: str) -> Path:
    return cluster.member_dir(member["node"], member["id"]) / "output" / name


def _allocations(cluster: Cluster, job_id: int) -> list[dict]:
    return cluster.db.fetch_all(
        """SELECT g.*, n.name AS node FROM gpu_allocations g JOIN members m ON m.id = g.member_id
             JOIN nodes n ON n.id = g.node_id WHERE m.job_id = %s ORDER BY g.member_id""",
        (job_id,),
    )


def _start_commands(cluster: Cluster, member_id: int) -> list[dict]:
    return cluster.db.fetch_all(
        "SELECT * FROM node_commands WHERE kind = 'start' AND payload ->> 'member_id' = %s", (str(member_id),)
    )


def test_gateway_restarted_between_commit_and_start_runs_each_member_once_on_the_gpu_it_keeps(
    cluster: Cluster,
) -> None:
    proxy = OutageProxy(cluster.url).start()
    try:
        proxy.swallow("start")
        cluster.start_agent("a", "--simulate-gpus", "1", server=proxy.url)
        agent_b = cluster.start_agent("b", "--simulate-gpus", "1", "--hold-after-spawn", "120")
        cluster.start_worker()
        archive = cluster.upload_source({"job.py": RUN_ONCE})
        flag = cluster.root / "release"
        job_id = cluster.submit(_spec(archive, flag, nodes=2))

        # COMMIT recorded; a's START left the outbox but never reached a; b spawned its runner and holds
        # before recording it (START not acknowledged).
        members = cluster.wait_members(job_id, "starting", timeout=60)
        by_node = {m["node"]: m for m in members}
        wait_for(lambda: proxy.swallowed, timeout=20, what="a's START taken by the gateway")
        agent_b.wait_line(f"member {by_node['b']['id']}: holding")
        wait_for(_output(cluster, by_node["b"], "runs").exists, timeout=30, what="b's workload started")
        for m in members:
            (start,) = _start_commands(cluster, m["id"])
            assert start["delivered_at"] is not None and start["acked_at"] is None
        # A job that needs one of those GPUs waits.
        waiting = cluster.submit(_spec(archive, cluster.root / "release", nodes=1))
        assert cluster.job(waiting)["state"] == "queued"

        proxy.swallow()  # the new gateway's deliveries pass
        cluster.restart_gateway()

        members = cluster.wait_members(job_id, "running", timeout=60)
        cluster.agents["a"].wait_line(f"member {by_node['a']['id']} (job {job_id} rank")
        agent_b.wait_line(f"member {by_node['b']['id']}: adopted")
        for m in members:
            (start,) = wait_for(
                lambda m=m: [c for c in _start_commands(cluster, m["id"]) if c["acked_at"] is not None],
                timeout=20,
                what=f"START of member {m['id']} acknowledged",
            )
            assert start["error"] is None, start
            assert start["delivery_count"] >= 2, "delivered to the old session and again to the new one"
            assert m["released_at"] is None and m["contact_lost_at"] is None
        before = _allocations(cluster, job_id)
        assert [(g["node"], g["gpu_index"], g["released_at"]) for g in before] == [
            ("a", 0, None),
            ("b", 0, None),
        ]
        assert cluster.job(waiting)["state"] == "queued", cluster.diagnose(waiting)

        flag.write_text("go")
        job = cluster.wait_job(job_id, ("succeeded", "failed", "cancelled"), timeout=60)
        assert job["state"] == "succeeded", cluster.diagnose(job_id)
        # (b holds every spawn, so the waiting job is followed only until it has its GPU.)
        (placed,) = wait_for(
            lambda: _allocations(cluster, waiting), timeout=60, what="the waiting job placed"
        )

        ended: dict[str, float] = {}
        for m in cluster.members(job_id):
            assert (m["state"], m["exit_code"], m["attempt_id"]) == ("exited", 0, members[0]["attempt_id"])
            runs = _output(cluster, m, "runs").read_text().split()
            assert len(runs) == 1, f"member {m['id']} ran {len(runs)} times"
            runner_log = (cluster.member_dir(m["node"], m["id"]) / "logs" / "runner.log").read_text()
            assert runner_log.count("starting member") == 1, runner_log
            assert len(_start_commands(cluster, m["id"])) == 1
            ended[m["node"]] = float(_output(cluster, m, "ended").read_text())
        # Each member kept the GPU it was given (never released and re-allocated meanwhile); the waiting
        # job got that GPU only after the workload on it had ended and the GPU was released.
        after = _allocations(cluster, job_id)
        assert [(g["node"], g["gpu_index"], g["allocated_at"]) for g in after] == [
            (g["node"], g["gpu_index"], g["allocated_at"]) for g in before
        ]
        (previous,) = [
            g for g in after if (g["node"], g["gpu_index"]) == (placed["node"], placed["gpu_index"])
        ]
        assert placed["allocated_at"] > previous["released_at"]
        assert placed["allocated_at"] > dt.datetime.fromtimestamp(ended[placed["node"]], dt.UTC)
        assert all(m["released_at"] is not None for m in cluster.members(job_id))
        # Once every runner here ended, both agents have waited for them: the runner whose START the
        # restart cut short (adopted), and the waiting job's (b holds it between spawn and record).
        dirs = [
            cluster.member_dir(m["node"], m["id"])
            for m in [*cluster.members(job_id), *cluster.members(waiting)]
        ]
        runners = [
            wait_for(lambda d=d: read_runner_pids(d).get("runner"), timeout=30, what=f"{d}") for d in dirs
        ]
        wait_for(lambda: not any(alive(pid) for pid in runners), timeout=30, what="every runner ended")
        for proc in cluster.agents.values():
            wait_for(lambda proc=proc: not zombies_under(proc.process.pid), timeout=20, what="no zombie")
    finally:
        proxy.stop()


def _tag(cluster: Cluster, agent: str, member_id: int) -> str:
    state, work = cluster.agent_dirs(agent)
    return member_tag(AgentPaths(state.resolve(), work.resolve()), member_id)


def test_fencing_a_connected_node_kills_its_workload_before_unfence_is_allowed(cluster: Cluster) -> None:
    cluster.start_agent("a")
    cluster.start_worker()
    archive = cluster.upload_source({"job.py": RUN_ONCE})
    # The workload ignores SIGTERM: the agent's KILL has to escalate to SIGKILL after its grace.
    job_id = cluster.submit(_spec(archive, cluster.root / "never", nodes=1, gpus=0, IGNORE_SIGTERM="1"))
    (member,) = cluster.wait_members(job_id, "running", timeout=60)
    member["node"] = "a"
    wait_for(_output(cluster, member, "runs").exists, timeout=30, what="the workload started")
    tag = _tag(cluster, "a", member["id"])
    assert tagged(tag)
    assert cluster.node("a")["connectivity"] == "connected"

    cluster.db.call("fence_node", "gpu/a", "e2e: fence a live node", "user:test")
    (lost,) = cluster.members(job_id)
    # Connected: held until the agent acknowledges the KILL (it may not have run yet).
    assert lost["state"] == "lost"
    (kill,) = cluster.db.fetch_all("SELECT * FROM node_commands WHERE kind = 'kill'")
    assert kill["payload"]["member_ids"] == [member["id"]]

    refusals: list[str] = []

    def unfenced() -> bool:
        alive = bool(tagged(tag))
        try:
            return bool(cluster.db.call("unfence_node", "gpu/a", "e2e", "user:test")[0]["unfence_node"])
        except Refusal as refusal:
            assert refusal.status == 409, refusal
            refusals.append(f"{refusal.message} (workload alive: {alive})")
            return False

    try:
        wait_for(unfenced, timeout=30, interval=0.1, what="unfence allowed")
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{refusals[-3:]}\n{cluster.diagnose(job_id)}") from None
    # Refused at first (the KILL not yet acknowledged) …
    assert refusals and "KILL" in refusals[0] and "workload alive: True" in refusals[0], refusals
    # … and allowed only once the workload was gone: the agent acknowledges KILL after its processes ended.
    assert not tagged(tag), "unfence was allowed while the fenced member's workload still ran"
    (kill,) = cluster.db.fetch_all("SELECT * FROM node_commands WHERE kind = 'kill'")
    assert kill["acked_at"] is not None and kill["error"] is None, kill
    assert cluster.node("a")["fenced_at"] is None
    assert cluster.job(job_id)["state"] == "failed"
    assert cluster.held() == 0


def _standbys(agent_pid: int) -> list[psutil.Process]:
    found = []
    for child in psutil.Process(agent_pid).children():
        try:
            if child.cmdline()[-1:] == ["--standby"]:
                found.append(child)
        except psutil.Error:
            continue
    return found


def test_a_member_starts_on_the_agents_standby_runner_and_a_killed_agent_leaves_no_standby(
    cluster: Cluster,
) -> None:
    agent = cluster.start_agent("a", "--simulate-gpus", "1")
    cluster.start_worker()
    (standby,) = wait_for(lambda: _standbys(agent.process.pid), timeout=60, what="the agent's standby runner")
    archive = cluster.upload_source({"job.py": RUN_ONCE})
    flag = cluster.root / "release"
    job_id = cluster.submit(_spec(archive, flag, nodes=1))
    (member,) = cluster.wait_members(job_id, "running", timeout=60)
    # The standby became the member's runner: the pid the agent reported is the one started beforehand.
    wait_for(_output(cluster, member, "runs").exists, timeout=30, what="the workload started")
    pids = read_runner_pids(cluster.member_dir("a", member["id"]))
    assert pids["runner"] == standby.pid
    (refilled,) = wait_for(
        lambda: [p for p in _standbys(agent.process.pid) if p.pid != standby.pid],
        timeout=30,
        what="the pool refilled",
    )
    flag.write_text("go")
    assert cluster.wait_job(job_id, ("succeeded", "failed"), timeout=60)["state"] == "succeeded"

    # Its pipe's only writer is the agent: an agent killed -9 leaves no standby behind.
    cluster.kill9(agent)
    wait_for(lambda: not refilled.is_running() or refilled.status() == psutil.STATUS_ZOMBIE, timeout=30,
             what="the standby to exit with its agent")  # fmt: skip
