"""Image jobs end to end with podman and a registry on loopback: the preview pins the tag's digest, PREPARE
pulls and verifies it, the member runs in the container (host network, its output directory mounted, its
variables), its JSONL metrics are collected from the host, cancel leaves no container; 1 and 2 members;
an image whose tag moved after the preview is refused at PREPARE."""

from __future__ import annotations

import shutil
import subprocess
import uuid

import pytest

from tests.container_registry import push_image
from tests.e2e.launch_cluster import MIB, Cluster
from tests.helpers import wait_for
from tuneplane.app.submission import service
from tuneplane.workers.runner.containers import container_name, global_options, runtime_env

pytestmark = pytest.mark.e2e

# Rank 0 listens on MASTER_PORT, rank 1 connects to MASTER_ADDR:MASTER_PORT (retrying until rank 0 listens):
# the rendezvous works across the two members' containers on the host network. The listener's stdin is a
# pipe held open (`sleep 60 |`): a background job's stdin is /dev/null, and busybox nc that reads EOF there
# can end before it reads what the peer sent (the peer's nc still exits 0) — 13 of 60 such listeners on a
# loaded machine wrote nothing; this test's occasional "rank 0 exit 1" (stop 26) was that, not TunePlane.
RENDEZVOUS = r"""
set -e
echo "rank $RANK of $WORLD_SIZE master $MASTER_ADDR:$MASTER_PORT"
test -n "$RANK" -a -n "$WORLD_SIZE"
if [ "$WORLD_SIZE" -gt 1 ]; then
  if [ "$RANK" = 0 ]; then
    sleep 60 | nc -l -p "$MASTER_PORT" > /tmp/got & listener=$!
    wait $listener
    grep -q "hello from 1" /tmp/got
    echo "rank 0 heard: $(cat /tmp/got)"
  else
    n=0; until echo "hello from $RANK" | nc "$MASTER_ADDR" "$MASTER_PORT"; do
      n=$((n+1)); [ $n -lt 100 ] || exit 3; sleep 0.2; done
  fi
fi
for step in 1 2 3; do
  printf '{"step": %s, "loss": %s.5}\n' "$step" "$((4 - step))" >> "$TUNEPLANE_OUTPUT_DIR/metrics.jsonl"
done
"""


def _spec(cluster: Cluster, ref: str, command: str, nodes: int = 1) -> dict:
    return {
        "image": {"ref": ref, "command": command},
        "resources": {"nodes": nodes, "gpus_per_node": 0, "cpus_per_node": 1, "memory_per_node": 64 * MIB},
    }


def _containers(cluster: Cluster, members: list[dict]) -> list[str]:
    binary = shutil.which("podman") or "podman"
    done = subprocess.run(
        [binary, *global_options(binary), "ps", "--all", "--format", "{{.Names}}"],
        capture_output=True,
        text=True,
        env=runtime_env(),
        check=True,
    )
    wanted = {container_name(m["id"], cluster.member_dir(m["node"], m["id"]).resolve()) for m in members}
    return [name for name in done.stdout.split() if name in wanted]


def _loss_ranks(cluster: Cluster, job_id: int) -> list[dict]:
    return cluster.db.fetch_all(
        "SELECT DISTINCT member_rank FROM telemetry_series WHERE job_id = %s AND name = 'loss'", (job_id,)
    )


def _stdout(cluster: Cluster, member: dict) -> str:
    path = cluster.member_dir(member["node"], member["id"]) / "logs" / "stdout.log"
    return path.read_text() if path.exists() else ""


def test_image_jobs_run_in_podman_collect_metrics_and_cancel_cleanly(cluster: Cluster, registry) -> None:
    telemetry = cluster.start_telemetry_gateway()
    cluster.start_agent("a", "--telemetry-url", telemetry)
    cluster.start_agent("b", "--telemetry-url", telemetry)
    cluster.start_worker()
    wait_for(
        lambda: cluster.node("b")["container_runtimes"] == ["podman"], timeout=30, what="podman detected"
    )
    ref = f"{registry.host}/tuneplane/busybox:1"

    for nodes in (1, 2):
        job_id = cluster.submit(_spec(cluster, ref, RENDEZVOUS, nodes))
        job = cluster.wait_job(job_id, ("succeeded", "failed", "cancelled"), timeout=120)
        assert job["state"] == "succeeded", cluster.diagnose(job_id)
        assert job["spec"]["runtime"]["image"] == f"{ref}@{registry.digests['1']}"
        members = cluster.members(job_id)
        assert len(members) == nodes
        for m in members:
            assert f"rank {m['rank']} of {nodes} master" in _stdout(cluster, m)
        if nodes == 2:
            assert "rank 0 heard: hello from 1" in _stdout(cluster, members[0])
        wait_for(
            lambda job_id=job_id, nodes=nodes: len(_loss_ranks(cluster, job_id)) == nodes,
            timeout=30,
            what="every member's loss series collected",
        )
        events = cluster.db.fetch_all(
            "SELECT reason FROM job_events WHERE job_id = %s AND detail ->> 'kind' = 'prepare'", (job_id,)
        )
        assert any("image" in e["reason"] for e in events), events
        assert _containers(cluster, members) == []

    # Cancel: SIGTERM reaches the shell through podman and catatonit; no container is left.
    job_id = cluster.submit(_spec(cluster, ref, "echo started; sleep 600"))
    members = cluster.wait_members(job_id, "running", timeout=60)
    try:
        wait_for(lambda: "started" in _stdout(cluster, members[0]), timeout=30, what="the container runs")
    except AssertionError:
        logs = cluster.member_dir(members[0]["node"], members[0]["id"]) / "logs"
        found = {p.name: p.read_text()[-800:] for p in logs.glob("*")} if logs.exists() else {}
        raise AssertionError(f"{found}\n{cluster.diagnose(job_id)}") from None
    assert len(_containers(cluster, members)) == 1
    cluster.db.call("cancel_job", job_id, cluster.user_id, "e2e")
    assert cluster.wait_job(job_id, ("cancelled",), timeout=60)["state"] == "cancelled"
    assert cluster.held() == 0
    wait_for(lambda: _containers(cluster, members) == [], timeout=20, what="the container removed")

    # A tag that moves between preview and PREPARE: the confirmed image is no longer what the tag names.
    moving = f"{registry.host}/tuneplane/busybox:moving"
    push_image(registry, "tuneplane/busybox", "moving", marker="first")
    preview = service.create_preview(
        cluster.db, cluster.user_id, {"fleet": cluster.fleet, **_spec(cluster, moving, "true")}
    )
    push_image(registry, "tuneplane/busybox", "moving", marker="second")
    receipt = service.confirm(
        cluster.db, cluster.user_id, preview["id"], preview["digest"], str(uuid.uuid4())
    )
    job = cluster.wait_job(int(receipt["job_id"]), ("failed", "succeeded"), timeout=60)
    assert job["state"] == "failed" and "now points to" in job["state_reason"], job["state_reason"]
    assert cluster.held() == 0
