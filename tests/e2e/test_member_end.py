"""The end of a member under faults (issue 16) and the agent's process lifecycle (issue 10 items 3, 12).

A member that exited 0 is recorded `exited 0` and its outputs arrive, whatever restarts around its end:
the node gateway, the agent (kill -9), the runner (kill -9), an artifact server answering 503. The agent
never starts a member twice (a runner alive after an agent crash is adopted) and leaves no zombie.
Repeat-N items loop inside one test with a tiny member (a 64 KiB checkpoint, a release flag).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from tests.e2e.launch_cluster import MIB, TINY_MEMBER, Cluster
from tests.e2e.node_processes import zombies_under
from tests.e2e.outage_proxy import OutageProxy
from tests.helpers import wait_for
from tuneplane.workers.artifacts.upload import INLINE_MAX_BYTES

pytestmark = pytest.mark.e2e

REPEAT = 5


def _spec(archive: str, flag: Path, exit_code: int = 0, burst: int = 0, ckpt_bytes: int = 64 * 1024) -> dict:
    env = {
        "RELEASE_FLAG": str(flag),
        "EXIT": str(exit_code),
        "BURST_LINES": str(burst),
        "CKPT_BYTES": str(ckpt_bytes),
    }
    return {
        "source": {"archive": archive, "entrypoint": "python job.py", "integration": "script"},
        "resources": {"nodes": 1, "gpus_per_node": 0, "cpus_per_node": 1, "memory_per_node": 64 * MIB},
        "env": env,
        "outputs": [{"name": "ckpt", "path": "ckpt"}],
    }


def _artifact(cluster: Cluster, job_id: int) -> dict | None:
    return cluster.db.fetch_one("SELECT * FROM artifacts WHERE job_id = %s AND name = 'ckpt'", (job_id,))


def _running_member(cluster: Cluster, job_id: int, agent: str = "a") -> dict:
    (member,) = cluster.wait_members(job_id, "running", timeout=60)
    started = cluster.member_dir(agent, member["id"]) / "output" / "started"
    wait_for(started.exists, timeout=30, what="the workload to start")
    return member


def _exited(cluster: Cluster, agent: str, member: dict) -> bool:
    return (cluster.member_dir(agent, member["id"]) / "exit_status.json").exists()


def _ending(cluster: Cluster, agent: str, member: dict) -> Callable[[], None]:
    """Three moments around a member's exit, taken in turn by the rounds of a repeated test."""

    def exited() -> None:
        wait_for(lambda: _exited(cluster, agent, member), timeout=20, what="the member's exit")

    def delivered() -> None:  # outputs delivered; the agent drains the logs and reports the end now
        wait_for(
            lambda: cluster.db.fetch_one(
                "SELECT 1 FROM artifacts WHERE member_id = %s AND state = 'complete'", (member["id"],)
            ),
            timeout=20,
            interval=0.005,
            what="the member's outputs delivered",
        )

    return exited, delivered


def _succeeds_with_its_checkpoint(cluster: Cluster, job_id: int, what: str) -> None:
    job = cluster.wait_job(job_id, ("succeeded", "failed", "cancelled"), timeout=90)
    assert job["state"] == "succeeded", f"{what}: {cluster.diagnose(job_id)}"
    (member,) = cluster.members(job_id)
    assert (member["state"], member["exit_code"]) == ("exited", 0), what
    artifact = wait_for(
        lambda: (a := _artifact(cluster, job_id)) is not None and a["state"] != "uploading" and a,
        timeout=90,
        what=f"{what}: the checkpoint artifact to complete",
    )
    assert artifact["state"] == "complete", (what, artifact)


Disruption = Callable[[int, Callable[[], None], dict], None]


def _repeat_around_the_exit(cluster: Cluster, disrupt: Disruption) -> None:
    archive = cluster.upload_source({"job.py": TINY_MEMBER})
    for round_ in range(REPEAT):
        flag = cluster.root / f"release-{round_}"
        job_id = cluster.submit(_spec(archive, flag, burst=3_000))
        member = _running_member(cluster, job_id)
        disrupt(round_, lambda flag=flag: flag.write_text("go"), member)
        _succeeds_with_its_checkpoint(cluster, job_id, f"round {round_}")
    assert cluster.held() == 0


def test_gateway_restarted_as_a_member_exits_0_it_succeeds_with_its_checkpoint(cluster: Cluster) -> None:
    # Every exit report waits 1 s after the member's end record (test option): the first moment below.
    agent = cluster.start_agent("a", "--hold-exit-report", "1")
    cluster.start_worker()

    def disrupt(round_: int, release: Callable[[], None], member: dict) -> None:
        exited, _ = _ending(cluster, "a", member)
        if round_ % 3 == 0:  # the end recorded, outputs delivered, logs drained, the report not sent
            release()
            agent.wait_line(f"member {member['id']}: holding the exit report")
            cluster.restart_gateway()
        elif round_ % 3 == 1:  # the gateway goes away, the member exits, the gateway comes back
            cluster.restart_gateway(meanwhile=lambda: (release(), exited()))
        else:  # the member exits, and the gateway goes away at once
            release()
            exited()
            cluster.restart_gateway()

    _repeat_around_the_exit(cluster, disrupt)


def test_agent_killed_as_a_member_exits_0_it_succeeds_with_its_checkpoint(cluster: Cluster) -> None:
    cluster.start_agent("a", "--hold-exit-report", "30")  # the first round only (restarted without)
    cluster.start_worker()

    def disrupt(round_: int, release: Callable[[], None], member: dict) -> None:
        exited, delivered = _ending(cluster, "a", member)
        release()
        if round_ == 0:  # the end recorded, outputs delivered, logs drained, the report not sent
            cluster.agents["a"].wait_line(f"member {member['id']}: holding the exit report")
        elif round_ % 3 == 0:  # outputs delivered; logs draining or the end being reported
            delivered()
        elif round_ % 3 == 1:  # the exit status is written: ending, delivering, reporting
            exited()
        cluster.kill9(cluster.agents["a"])
        cluster.start_agent("a", enroll=False)

    _repeat_around_the_exit(cluster, disrupt)


def test_artifact_server_answering_503_delays_only_the_artifact_and_only_until_its_deadline(
    cluster: Cluster,
) -> None:
    proxy = OutageProxy(cluster.url).start()
    try:
        cluster.start_agent("a", server=proxy.url)
        cluster.start_worker()
        archive = cluster.upload_source({"job.py": TINY_MEMBER})
        flag = cluster.root / "release"
        job_id = cluster.submit(_spec(archive, flag))
        _running_member(cluster, job_id)
        outage = proxy.refuse("POST", "/api/artifacts", seconds=10)
        flag.write_text("go")
        # The member's end is reported while registration is still refused: exited 0, job succeeded.
        job = cluster.wait_job(job_id, ("succeeded", "failed"), timeout=30)
        assert job["state"] == "succeeded", cluster.diagnose(job_id)
        (member,) = cluster.members(job_id)
        assert (member["state"], member["exit_code"]) == ("exited", 0)
        assert outage.refused, "the registration was never refused"
        assert _artifact(cluster, job_id) is None, "registered during the outage"
        artifact = wait_for(
            lambda: (a := _artifact(cluster, job_id)) is not None and a["state"] == "complete" and a,
            timeout=90,
            what="the artifact to complete after the outage",
        )
        assert artifact["state"] == "complete"
        assert len(outage.refused) >= 2, "delivery was not retried during the outage"

        # Past its deadline a delivery gives up: the artifact is failed with the reason, the member's
        # exit 0 stands (another node of the fleet, whose agent delivers within 3 s or not at all).
        cluster.db.call("cordon_node", "gpu/a", "e2e: the next job goes to b", "user:test")
        cluster.start_agent("b", "--delivery-deadline", "3", server=proxy.url)
        flag = cluster.root / "release-b"
        # Larger than an inline registration takes (ADR 0255): registered, then uploaded in chunks.
        job_id = cluster.submit(_spec(archive, flag, ckpt_bytes=INLINE_MAX_BYTES + 1))
        _running_member(cluster, job_id, agent="b")
        proxy.refuse("PUT", "/api/artifacts/*", seconds=300)  # every chunk upload fails
        flag.write_text("go")
        assert cluster.wait_job(job_id, ("succeeded", "failed"), timeout=60)["state"] == "succeeded"
        failed = wait_for(
            lambda: (a := _artifact(cluster, job_id)) is not None and a["state"] == "failed" and a,
            timeout=60,
            what="the undeliverable artifact to be failed at the deadline",
        )
        assert "gave up at its deadline" in failed["reason"] and "503" in failed["reason"], failed
    finally:
        proxy.stop()


def test_runner_killed_mid_run_records_the_workloads_real_exit_and_delivers_its_checkpoint(
    cluster: Cluster,
) -> None:
    cluster.start_agent("a")
    cluster.start_worker()
    archive = cluster.upload_source({"job.py": TINY_MEMBER})
    # A workload that exits 0, and one that exits 3: the recorded status is the workload's, not -9.
    for exit_code in (0, 3):
        flag = cluster.root / f"release-{exit_code}"
        job_id = cluster.submit(_spec(archive, flag, exit_code))
        member = _running_member(cluster, job_id)
        cluster.kill9_pid(member["pid"])
        (member,) = cluster.members(job_id)
        assert member["state"] == "running", "a killed runner is not the end of the workload"
        flag.write_text("go")
        if exit_code == 0:
            _succeeds_with_its_checkpoint(cluster, job_id, "runner killed")
        else:
            job = cluster.wait_job(job_id, ("succeeded", "failed"), timeout=60)
            (member,) = cluster.members(job_id)
            assert (job["state"], member["state"], member["exit_code"]) == ("failed", "failed", 3)
            assert member["reason"] == "exited with status 3"


def test_agent_killed_between_spawn_and_record_adopts_the_live_runner(cluster: Cluster) -> None:
    agent = cluster.start_agent("a", "--hold-after-spawn", "60")
    cluster.start_worker()
    archive = cluster.upload_source({"job.py": TINY_MEMBER})
    flag = cluster.root / "release"
    job_id = cluster.submit(_spec(archive, flag))
    agent.wait_line("between spawn and record")
    (member,) = cluster.members(job_id)
    directory = cluster.member_dir("a", member["id"])
    wait_for((directory / "output" / "started").exists, timeout=30, what="the workload to start")
    cluster.kill9(agent)  # the runner runs; the agent never recorded it
    restarted = cluster.start_agent("a", enroll=False)
    restarted.wait_line(f"member {member['id']}: adopted")
    flag.write_text("go")
    _succeeds_with_its_checkpoint(cluster, job_id, "adopted")
    runner_log = (directory / "logs" / "runner.log").read_text()
    assert runner_log.count("starting member") == 1, runner_log
    assert "another runner holds" not in runner_log


def test_no_zombie_under_the_agent_after_20_jobs(cluster: Cluster) -> None:
    telemetry = cluster.start_telemetry_gateway()  # every member gets a collector too
    agent = cluster.start_agent("a", "--telemetry-url", telemetry)
    cluster.start_worker()
    archive = cluster.upload_source({"job.py": "print('done')\n"})
    spec = {
        "source": {"archive": archive, "entrypoint": "python job.py", "integration": "script"},
        "resources": {"nodes": 1, "gpus_per_node": 0, "cpus_per_node": 1, "memory_per_node": 64 * MIB},
    }
    jobs = [cluster.submit(spec) for _ in range(20)]
    for job_id in jobs:
        job = cluster.wait_job(job_id, ("succeeded", "failed", "cancelled"), timeout=180)
        assert job["state"] == "succeeded", cluster.diagnose(job_id)
    collectors = list((cluster.agent_dirs("a")[1] / "members").glob("*/logs/collector.log"))
    assert len(collectors) == 20, "each member had a collector (a child of the agent)"
    wait_for(lambda: not zombies_under(agent.process.pid), timeout=20, what="no zombie under the agent")
