"""Launch end to end: real agents, a real gateway, real workers and runners, real torch.distributed.

Each test builds a small cluster (tests/e2e/launch_cluster.py) and drives jobs through submission; what
the tests check is what the database and the processes on the machine say afterwards.
"""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from app.db import Database
from tests.e2e.launch_cluster import MIB, Cluster
from tests.helpers import wait_for
from workers.proctree import tagged

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


@pytest.fixture
def cluster(db_url: str, db: Database, tmp_path: Path, port: int) -> Iterator[Cluster]:
    c = Cluster(db_url, db, tmp_path, port)
    c.start()
    try:
        yield c
    finally:
        c.stop_all()


def _resources(nodes: int = 2) -> dict:
    return {"nodes": nodes, "gpus_per_node": 0, "cpus_per_node": 1, "memory_per_node": 64 * MIB}


def test_two_member_torchrun_job_rendezvouses_across_two_agents_and_succeeds(cluster: Cluster) -> None:
    cluster.start_agent("a")
    cluster.start_agent("b")
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
        seen[m["rank"]] = json.loads((cluster.member_dir(m["node"], m["id"]) / "output" / "seen.json").read_text())
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
    peer = cluster.node("a")["last_peer_check"]
    assert peer["ok"] is True and peer["peers"][0]["ok"] is True
