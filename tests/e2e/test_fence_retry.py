"""Fence and retire of a connected node, end to end (issue 24): a real node gateway, two real agents and a
worker, real runners.

* Fencing a connected node that runs a 1-member job with attempts left: the member is lost but stays held
  until the fenced node's agent acknowledged its KILL (the agent acknowledges only once no process of the
  member is left); only then is the job queued again and its second attempt placed on the other node. A
  watcher samples both attempts' processes all along: no moment has both alive.
* Retiring a connected node that runs a member: the retire sends KILL as a fence does; the agent, still
  connected, kills the workload and acknowledges; no process of the member is left on the node.
"""

from __future__ import annotations

import threading
import time

import pytest

from tests.e2e.launch_cluster import MIB, Cluster
from tests.helpers import wait_for
from tuneplane.workers.agent.directories import AgentPaths
from tuneplane.workers.agent.member_records import member_tag
from tuneplane.workers.proctree import tagged

pytestmark = pytest.mark.e2e

# Writes its pid, then waits for RELEASE_FLAG (ignoring SIGTERM when asked, so a KILL must escalate).
WORKLOAD = """
import os, pathlib, signal, time
if os.environ.get("IGNORE_SIGTERM"):
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
out = pathlib.Path(os.environ["TUNEPLANE_OUTPUT_DIR"])
(out / "started").write_text(str(os.getpid()))
flag = pathlib.Path(os.environ["RELEASE_FLAG"])
while not flag.exists():
    time.sleep(0.05)
"""


def _spec(archive: str, cluster: Cluster, max_attempts: int) -> dict:
    return {
        "source": {"archive": archive, "entrypoint": "python job.py", "integration": "script"},
        "resources": {"nodes": 1, "gpus_per_node": 0, "cpus_per_node": 1, "memory_per_node": 64 * MIB},
        "env": {"RELEASE_FLAG": str(cluster.root / "release"), "IGNORE_SIGTERM": "1"},
        "max_attempts": max_attempts,
    }


def _tag(cluster: Cluster, agent: str, member_id: int) -> str:
    state, work = cluster.agent_dirs(agent)
    return member_tag(AgentPaths(state.resolve(), work.resolve()), member_id)


class ProcessWatch:
    """Samples, every few milliseconds, which members of a job have a process alive (by their tag)."""

    def __init__(self, cluster: Cluster, job_id: int) -> None:
        self.cluster, self.job_id = cluster, job_id
        self.samples: list[tuple[float, frozenset[int]]] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        tags: dict[int, str] = {}
        while not self.stop.is_set():
            for m in self.cluster.members(self.job_id):
                tags.setdefault(m["id"], _tag(self.cluster, m["node"], m["id"]))
            alive = frozenset(member for member, tag in tags.items() if tagged(tag))
            self.samples.append((time.monotonic(), alive))
            time.sleep(0.01)

    def __enter__(self) -> ProcessWatch:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(10)


def test_fencing_a_connected_node_retries_elsewhere_only_after_the_node_says_its_member_is_gone(
    cluster: Cluster,
) -> None:
    cluster.start_agent("a")
    cluster.start_agent("b")
    cluster.start_worker()
    archive = cluster.upload_source({"job.py": WORKLOAD})
    job_id = cluster.submit(_spec(archive, cluster, max_attempts=2))
    (first,) = cluster.wait_members(job_id, "running", timeout=60)
    fenced, other = first["node"], ({"a", "b"} - {first["node"]}).pop()
    started = cluster.member_dir(fenced, first["id"]) / "output" / "started"
    wait_for(started.exists, timeout=30, what="the first attempt's workload started")

    with ProcessWatch(cluster, job_id) as watch:
        cluster.db.call("fence_node", f"gpu/{fenced}", "e2e: fence a live node", "user:test")
        (lost,) = cluster.members(job_id)
        # Connected: lost, KILL queued, still held; the job is not queued again yet.
        assert lost["state"] == "lost" and lost["released_at"] is None, lost
        assert cluster.job(job_id)["state"] == "running"

        second = wait_for(
            lambda: next(
                (m for m in cluster.members(job_id) if m["attempt_id"] != first["attempt_id"]), None
            ),
            timeout=60,
            what="the second attempt",
        )
        wait_for(
            lambda: (
                cluster.db.fetch_one("SELECT state FROM members WHERE id = %s", (second["id"],))["state"]
                == "running"
            ),
            timeout=60,
            what="the second attempt running",
        )
        wait_for(
            (cluster.member_dir(other, second["id"]) / "output" / "started").exists,
            timeout=30,
            what="the second attempt's workload started",
        )
    (kill,) = cluster.db.fetch_all("SELECT * FROM node_commands WHERE kind = 'kill'")
    assert kill["acked_at"] is not None and kill["error"] is None, kill
    attempts = cluster.db.fetch_all("SELECT * FROM attempts WHERE job_id = %s ORDER BY number", (job_id,))
    assert len(attempts) == 2
    # The retry was placed only after the fenced node said the member was gone: its KILL acknowledged or the
    # member's end reported, whichever came first (lose_node_members releases it on either; the agent
    # reports the end its KILL caused a few ms before it acknowledges the KILL) …
    released = cluster.db.fetch_one("SELECT released_at FROM members WHERE id = %s", (first["id"],))
    placed = cluster.db.fetch_one(
        "SELECT max(at) AS at FROM job_events WHERE job_id = %s AND from_state = 'queued'", (job_id,)
    )["at"]  # the placement's clock, not attempts.created_at (its transaction's start)
    assert released["released_at"] is not None
    assert placed > released["released_at"], (placed, released["released_at"], kill["acked_at"])
    assert second["node"] == other
    # … and no sample ever saw both attempts' processes alive, while each was seen alive at some point.
    both = [t for t, alive in watch.samples if {first["id"], second["id"]} <= alive]
    assert both == [], f"both attempts alive at {len(both)} sample(s)"
    assert any(first["id"] in alive for _, alive in watch.samples)
    assert any(second["id"] in alive for _, alive in watch.samples)
    assert not tagged(_tag(cluster, fenced, first["id"]))

    (cluster.root / "release").write_text("go")
    cluster.wait_job(job_id, ("succeeded",), timeout=60)


def test_retiring_a_connected_node_leaves_no_process_of_its_member(cluster: Cluster) -> None:
    cluster.start_agent("a")
    cluster.start_worker()
    archive = cluster.upload_source({"job.py": WORKLOAD})
    job_id = cluster.submit(_spec(archive, cluster, max_attempts=1))
    (member,) = cluster.wait_members(job_id, "running", timeout=60)
    wait_for(
        (cluster.member_dir("a", member["id"]) / "output" / "started").exists,
        timeout=30,
        what="the workload started",
    )
    tag = _tag(cluster, "a", member["id"])
    assert tagged(tag)

    cluster.db.call("retire_node", "gpu/a", "e2e: retire a live node", "user:test")
    # Retired: the node is known gone, its member released at once; KILL goes to the connected agent.
    (lost,) = cluster.members(job_id)
    assert lost["state"] == "lost" and lost["released_at"] is not None
    try:
        wait_for(
            lambda: cluster.db.fetch_one(
                "SELECT acked_at IS NOT NULL AS done FROM node_commands WHERE kind = 'kill'"
            )["done"],
            timeout=30,
            what="the retired node's agent acknowledged its KILL",
        )
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{cluster.diagnose(job_id)}") from None
    (kill,) = cluster.db.fetch_all("SELECT * FROM node_commands WHERE kind = 'kill'")
    assert kill["error"] is None and kill["payload"]["member_ids"] == [member["id"]], kill
    assert not tagged(tag), "a process of the retired node's member is still alive"
    assert cluster.job(job_id)["state"] == "failed"
