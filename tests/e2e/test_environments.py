"""Job environments end to end: resolved at preview, built by the agent with uv during PREPARE, reused by
the next job with the same lock, a new one for another lock; a lock that cannot be built on the node aborts
with uv's reason and releases the reservation."""

from __future__ import annotations

import json

import pytest

from tests.e2e.launch_cluster import MIB, Cluster
from tests.helpers import wait_for

pytestmark = pytest.mark.e2e

MAIN = """
import json, os, sys
import six, tqdm
seen = {"six": six.__version__, "six_file": six.__file__, "tqdm": tqdm.__version__,
        "executable": sys.executable, "prefix": sys.prefix}
with open(os.path.join(os.environ["TUNEPLANE_OUTPUT_DIR"], "seen.json"), "w") as f:
    json.dump(seen, f)
print(seen, flush=True)
"""
RESOURCES = {"nodes": 1, "gpus_per_node": 0, "cpus_per_node": 1, "memory_per_node": 64 * MIB}


def _job(cluster: Cluster, archive: str, packages: list[str], **environment: object) -> int:
    return cluster.submit(
        {
            "source": {"archive": archive, "entrypoint": "python main.py"},
            "resources": RESOURCES,
            "environment": {"packages": packages, **environment},
        }
    )


def _prepare_events(cluster: Cluster, job_id: int) -> list[str]:
    rows = cluster.db.fetch_all(
        "SELECT reason FROM job_events WHERE job_id = %s AND detail ->> 'kind' = 'prepare' ORDER BY id",
        (job_id,),
    )
    return [r["reason"] for r in rows]


def _seen(cluster: Cluster, job_id: int) -> dict:
    member = cluster.members(job_id)[0]
    return json.loads((cluster.member_dir(member["node"], member["id"]) / "output" / "seen.json").read_text())


def test_environment_is_built_once_reused_and_a_new_lock_gets_its_own(cluster: Cluster) -> None:
    cluster.start_agent("a")
    cluster.start_worker()
    archive = cluster.upload_source({"main.py": MAIN})
    environments = cluster.agent_dirs("a")[1] / "environments"

    first = _job(cluster, archive, ["six==1.16.0", "tqdm"])
    assert cluster.wait_job(first, ("succeeded", "failed"), timeout=120)["state"] == "succeeded", (
        cluster.diagnose(first)
    )
    digest = cluster.job(first)["spec"]["runtime"]["environment"]["digest"]
    seen = _seen(cluster, first)
    # The member ran with the environment's interpreter and imported the lock's packages from it.
    assert seen["six"] == "1.16.0" and seen["prefix"] == str(environments / digest)
    assert seen["six_file"].startswith(str(environments / digest))
    events = _prepare_events(cluster, first)
    assert any(f"environment {digest[:12]} built in" in e for e in events), events
    assert any("downloading and installing" in e for e in events), events

    second = _job(cluster, archive, ["six==1.16.0", "tqdm"])
    assert cluster.wait_job(second, ("succeeded", "failed"), timeout=90)["state"] == "succeeded"
    assert _seen(cluster, second)["prefix"] == str(environments / digest)
    events = _prepare_events(cluster, second)
    assert any(f"environment {digest[:12]} reused (built in" in e for e in events), events
    assert not any("built in" in e and "reused" not in e for e in events), events

    other = _job(cluster, archive, ["six==1.15.0", "tqdm"])
    assert cluster.wait_job(other, ("succeeded", "failed"), timeout=120)["state"] == "succeeded"
    other_seen = _seen(cluster, other)
    assert other_seen["six"] == "1.15.0" and other_seen["prefix"] != seen["prefix"]
    ready = sorted(p.name for p in environments.iterdir() if p.is_dir())
    assert len(ready) == 2, ready  # no build directory left behind
    # The agent reports its cache sizes after each prepare (the Fleet page shows them).
    caches = wait_for(
        lambda: (c := cluster.node("a")["caches"]).get("environments", {}).get("count") == 2 and c,
        timeout=20,
        what="cache sizes reported",
    )
    assert caches["environments"]["bytes"] > 0 and caches["capsules"]["count"] >= 1

    # A lock that resolves but cannot be built here (no Python 3.9 on the node; uv never downloads one).
    failing = _job(cluster, archive, ["six==1.16.0"], python="3.9")
    job = cluster.wait_job(failing, ("failed", "succeeded"), timeout=90)
    assert job["state"] == "failed", cluster.diagnose(failing)
    assert "cannot be built" in job["state_reason"] and "3.9" in job["state_reason"], job["state_reason"]
    assert cluster.held() == 0, "a failed build releases the reservation"


def test_agent_killed_mid_build_leaves_no_build_directory_after_the_next_clean_up(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TUNEPLANE_TEST_HOLD_ENVIRONMENT_BUILD", "60")
    agent = cluster.start_agent("a")
    cluster.start_worker()
    archive = cluster.upload_source({"main.py": MAIN})
    environments = cluster.agent_dirs("a")[1] / "environments"
    job_id = _job(cluster, archive, ["six==1.16.0", "tqdm"])

    def builds() -> list[str]:
        return sorted(p.name for p in environments.glob("*.build-*")) if environments.is_dir() else []

    (abandoned,) = wait_for(builds, timeout=60, what="the environment build started")
    cluster.kill9(agent)  # mid-build: its venv exists, its packages are not installed
    assert builds() == [abandoned]

    monkeypatch.delenv("TUNEPLANE_TEST_HOLD_ENVIRONMENT_BUILD")
    cluster.start_agent("a", enroll=False)  # prepares the member again, then cleans up
    job = cluster.wait_job(job_id, ("succeeded", "failed"), timeout=120)
    assert job["state"] == "succeeded", cluster.diagnose(job_id)
    wait_for(lambda: builds() == [], timeout=30, what="the abandoned build removed by the clean-up")
    ready = sorted(p.name for p in environments.iterdir() if p.is_dir())
    assert len(ready) == 1 and ".build-" not in ready[0], ready
    wait_for(
        lambda: cluster.node("a")["caches"].get("environments", {}).get("count") == 1,
        timeout=20,
        what="cache sizes reported",
    )
