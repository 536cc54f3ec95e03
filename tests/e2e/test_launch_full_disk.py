"""The agent's state directory full (ENOSPC, a real size-limited tmpfs) around a member's start and end.

The agent writes member → runner pid to its state directory before it reports a start, and the member's
durable end record before it reports an end. When that write fails (the disk is full), the job must still
say what runs: a START whose record cannot be written leaves nothing running and fails the member with
the reason; a member that ends while its record cannot be written is still reported ended (the job is not
left running for ever). (A START's record that exists and fits a page is rewritten in place and needs no
space: MemberStore.save; the test below removes it, so START must write it whole, as it does a record
larger than a page.)

Needs root to mount a tmpfs (skipped otherwise).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.e2e.launch_cluster import MIB, Cluster
from tests.helpers import wait_for
from tests.small_fs import fill_up, small_tmpfs
from tuneplane.workers.agent.directories import AgentPaths
from tuneplane.workers.agent.member_records import member_tag
from tuneplane.workers.proctree import tagged

pytestmark = pytest.mark.e2e

WAIT_FOR_RELEASE = """
import os, pathlib, time
flag = pathlib.Path(os.environ["RELEASE_FLAG"])
pathlib.Path(os.environ["TUNEPLANE_OUTPUT_DIR"], "started").write_text(str(os.getpid()))
while not flag.exists():
    time.sleep(0.05)
"""


def _spec(archive: str, flag: Path, nodes: int) -> dict:
    return {
        "source": {"archive": archive, "entrypoint": "python job.py", "integration": "script"},
        "resources": {"nodes": nodes, "gpus_per_node": 0, "cpus_per_node": 1, "memory_per_node": 64 * MIB},
        "env": {"RELEASE_FLAG": str(flag)},
        "max_attempts": 1,
    }


def _tagged(cluster: Cluster, agent: str, member_id: int) -> set[int]:
    state, work = cluster.agent_dirs(agent)
    return tagged(member_tag(AgentPaths(state, work), member_id))


def test_a_start_whose_record_cannot_be_written_runs_nothing_and_fails_with_the_reason(
    cluster: Cluster,
) -> None:
    state, _ = cluster.agent_dirs("a")
    with small_tmpfs(state, "2m"):
        cluster.start_agent("a")
        # b holds its prepare, so a's member is prepared (its record written) well before COMMIT sends START.
        cluster.start_agent("b", "--hold-prepare", "6")
        cluster.start_worker()
        archive = cluster.upload_source({"job.py": WAIT_FOR_RELEASE})
        flag = cluster.root / "release"
        job_id = cluster.submit(_spec(archive, flag, nodes=2))
        on_a = wait_for(
            lambda: next(
                (m for m in cluster.members(job_id) if m["node"] == "a" and m["state"] == "prepared"), None
            ),
            timeout=30,
            what="a's member prepared",
        )
        # Written whole at START (a temporary file and a rename), which a full disk refuses; an existing
        # record would be rewritten in place (tests/unit/test_member_records.py).
        (state / "members" / f"{on_a['id']}.json").unlink()
        filler = fill_up(state)
        try:
            assert cluster.job(job_id)["state"] == "preparing", (
                "b prepared before the disk was full: hold longer"
            )
            job = cluster.wait_job(job_id, ("failed", "succeeded", "cancelled"), timeout=60)
            member = next(m for m in cluster.members(job_id) if m["id"] == on_a["id"])
            # Nothing of a's member may run once its resources are released (it ran on, unrecorded, before).
            assert member["released_at"] is not None
            assert not _tagged(cluster, "a", on_a["id"]), (
                "a's member runs on after its resources were released"
            )
            assert job["state"] == "failed", cluster.diagnose(job_id)
            assert "No space left on device" in member["reason"], member
            assert cluster.held() == 0
        finally:
            filler.unlink()
            flag.write_text("go")


def test_a_member_ending_while_its_record_cannot_be_written_is_still_reported_ended(cluster: Cluster) -> None:
    state, _ = cluster.agent_dirs("a")
    with small_tmpfs(state, "2m"):
        cluster.start_agent("a")
        cluster.start_worker()
        archive = cluster.upload_source({"job.py": WAIT_FOR_RELEASE})
        flag = cluster.root / "release"
        job_id = cluster.submit(_spec(archive, flag, nodes=1))
        (member,) = cluster.wait_members(job_id, "running", timeout=60)
        started = cluster.member_dir("a", member["id"]) / "output" / "started"
        wait_for(started.exists, timeout=30, what="the workload to start")
        filler = fill_up(state)
        try:
            flag.write_text("go")
            job = cluster.wait_job(job_id, ("succeeded", "failed", "cancelled"), timeout=40)
            assert job["state"] == "succeeded", cluster.diagnose(job_id)
            assert cluster.held() == 0
        finally:
            filler.unlink()


def test_a_capsule_fetch_that_fills_the_work_disk_fails_the_prepare_with_the_reason_and_leaves_no_partial(
    cluster: Cluster,
) -> None:
    _, work = cluster.agent_dirs("a")
    with small_tmpfs(work, "1m"):
        cluster.start_agent("a")
        cluster.start_worker()
        # 3 MiB of incompressible bytes: the capsule cannot fit in the 1 MiB work directory.
        archive = cluster.upload_source({"job.py": "print('never')\n", "blob.txt": os.urandom(3 * MIB).hex()})
        job_id = cluster.submit(_spec(archive, cluster.root / "unused", nodes=1))
        job = cluster.wait_job(job_id, ("failed", "succeeded", "cancelled"), timeout=90)
        assert job["state"] == "failed", cluster.diagnose(job_id)
        assert "No space left on device" in job["state_reason"], job["state_reason"]
        # Nothing of the failed fetches stays on the node's disk.
        assert list((work / "capsules").glob("*")) == []
        assert cluster.held() == 0
