"""A member's processes that do not carry its tag (a child started with a clean environment, `env -i`) are
still the member's: a cancel must end them before the member's resources are released, also after the
runner itself was killed (kill -9) and only its keeper is left.

Before the fix the agent found such a child only through the runner's descendants; with the runner gone
it SIGKILLed the keeper 2 s after the workload, in the middle of the keeper's own 5 s clean-up, and the
child (reparented to init) ran on after the member was recorded ended and released.
"""

from __future__ import annotations

import contextlib
import os
import signal

import pytest

from tests.e2e.launch_cluster import MIB, Cluster
from tests.helpers import wait_for
from tuneplane.workers.proctree import alive

pytestmark = pytest.mark.e2e

# The workload starts a helper with an empty environment (no TUNEPLANE_MEMBER_TAG), writes its pid, and
# waits; both ignore SIGTERM (the stop's SIGKILL ends the workload after the grace period).
WITH_UNTAGGED_CHILD = """
import os, pathlib, signal, subprocess, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
out = pathlib.Path(os.environ["TUNEPLANE_OUTPUT_DIR"])
code = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"
helper = subprocess.Popen([sys.executable, "-c", code], env={})
(out / "helper").write_text(str(helper.pid))
while True:
    time.sleep(0.05)
"""


def test_cancel_after_the_runner_was_killed_ends_an_untagged_child_before_release(cluster: Cluster) -> None:
    cluster.start_agent("a")
    cluster.start_worker()
    archive = cluster.upload_source({"job.py": WITH_UNTAGGED_CHILD})
    job_id = cluster.submit(
        {
            "source": {"archive": archive, "entrypoint": "exec python job.py", "integration": "script"},
            "resources": {"nodes": 1, "gpus_per_node": 0, "cpus_per_node": 1, "memory_per_node": 64 * MIB},
        }
    )
    (member,) = cluster.wait_members(job_id, "running", timeout=60)
    helper_file = cluster.member_dir("a", member["id"]) / "output" / "helper"
    wait_for(lambda: helper_file.exists() and helper_file.read_text(), timeout=30, what="the helper")
    helper = int(helper_file.read_text())
    try:
        cluster.kill9_pid(member["pid"])  # the runner; its keeper and the workload run on
        cluster.db.call("cancel_job", job_id, cluster.user_id, "e2e")
        job = cluster.wait_job(job_id, ("cancelled", "failed", "succeeded"), timeout=60)
        assert job["state"] == "cancelled", cluster.diagnose(job_id)
        assert cluster.held() == 0
        assert not alive(helper), "the member's helper runs on after its resources were released"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(helper, signal.SIGKILL)
