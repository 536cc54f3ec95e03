"""A launch that started nothing does not spend the user's attempts (migration 0140, docs/launch.md).

Something else on rank 0's node holds the attempt's MASTER_PORT: rank 0's prepare fails, the launch is
aborted, and the job (max_attempts 1) is launched again as a new attempt with another rendezvous port,
which runs and succeeds, instead of failing for a reason its user does not control.
"""

from __future__ import annotations

import socket

import pytest

from tests.e2e.launch_cluster import MIB, Cluster
from tests.helpers import wait_for

pytestmark = pytest.mark.e2e


def test_a_master_port_held_by_another_process_aborts_the_launch_and_a_free_relaunch_runs_the_job(
    cluster: Cluster,
) -> None:
    # The hold keeps rank 0 from checking its port until the test holds it.
    cluster.start_agent("a", "--hold-prepare", "2")
    cluster.start_worker()
    archive = cluster.upload_source({"job.py": "print('ran', flush=True)\n"})
    job_id = cluster.submit(
        {
            "source": {"archive": archive, "entrypoint": "python job.py", "integration": "script"},
            "resources": {"nodes": 1, "gpus_per_node": 0, "cpus_per_node": 1, "memory_per_node": 64 * MIB},
            "max_attempts": 1,
        }
    )
    first = wait_for(
        lambda: cluster.db.fetch_one("SELECT * FROM attempts WHERE job_id = %s AND number = 1", (job_id,)),
        timeout=30,
        what="the first attempt",
    )
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as squatter:
        squatter.bind(("0.0.0.0", first["master_port"]))
        squatter.listen()
        assert cluster.db.fetch_one("SELECT state FROM attempts WHERE id = %s", (first["id"],))["state"] in (
            "reserved",
            "preparing",
        ), "rank 0 prepared before the port was taken: hold longer"
        job = cluster.wait_job(job_id, ("succeeded", "failed", "cancelled"), timeout=60)
    assert job["state"] == "succeeded", cluster.diagnose(job_id)
    attempts = cluster.db.fetch_all("SELECT * FROM attempts WHERE job_id = %s ORDER BY number", (job_id,))
    assert [a["state"] for a in attempts] == ["aborted", "succeeded"], attempts
    assert f"cannot bind MASTER_PORT {first['master_port']}" in attempts[0]["reason"]
    assert attempts[1]["master_port"] != first["master_port"]
    reasons = [
        e["reason"]
        for e in cluster.db.fetch_all("SELECT reason FROM job_events WHERE job_id = %s", (job_id,))
    ]
    assert any("does not count against max_attempts" in r and "free re-launch 1 of 2" in r for r in reasons)
    assert cluster.held() == 0
