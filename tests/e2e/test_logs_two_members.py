"""Issue 15 point 8, end to end: a 2-member job runs on two real agents; `tuneplane jobs logs JOB` (a
real CLI process against a real console server) shows both members' output, each line with its rank."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.e2e.launch_cluster import MIB, Cluster
from tests.e2e.server_processes import running_servers
from tests.e2e.up_process import LEAKY, REPO
from tests.telemetry_support import user_api_token

pytestmark = pytest.mark.e2e

HELLO = """
import os
for i in range(3):
    print(f"hello {i} from rank {os.environ['TUNEPLANE_MEMBER_RANK']}", flush=True)
"""


def test_jobs_logs_of_a_two_member_job_shows_both_ranks(cluster: Cluster) -> None:
    cluster.start_agent("a")
    cluster.start_agent("b")
    cluster.start_worker()
    archive = cluster.upload_source({"hello.py": HELLO})
    job_id = cluster.submit(
        {
            "source": {"archive": archive, "entrypoint": "python hello.py", "integration": "script"},
            "resources": {"nodes": 2, "gpus_per_node": 0, "cpus_per_node": 1, "memory_per_node": 64 * MIB},
        }
    )
    job = cluster.wait_job(job_id, ("succeeded", "failed", "cancelled"), timeout=90)
    assert job["state"] == "succeeded", cluster.diagnose(job_id)
    with running_servers(cluster.db_url, cluster.root / "console", names=("console",)) as servers:
        env = {k: v for k, v in os.environ.items() if k not in LEAKY}
        env.update(
            TUNEPLANE_CONFIG=str(cluster.root / "none.toml"),
            TUNEPLANE_SERVER=servers.console.url,
            TUNEPLANE_TOKEN=user_api_token(cluster.db, cluster.user_id),
        )

        def logs(*args: str) -> subprocess.CompletedProcess:
            return subprocess.run(
                [sys.executable, "-P", "-m", "tuneplane", "jobs", "logs", str(job_id), *args],
                cwd=REPO, env=env, capture_output=True, text=True, timeout=60,
            )  # fmt: skip

        every = logs()
        one = logs("--member", "1")
    assert every.returncode == 0, every.stderr
    lines = every.stdout.splitlines()
    assert lines == [f"[rank {r}] hello {i} from rank {r}" for r in (0, 1) for i in range(3)], every.stdout
    assert one.stdout.splitlines() == [f"hello {i} from rank 1" for i in range(3)]
