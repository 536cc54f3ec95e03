"""Teams end to end (docs/teams.md): a real agent runs a team's job, the real worker places it, the console
answers over real HTTP on loopback. A viewer sees the job but cannot cancel it; a member of another team
gets 404 on every job-scoped route the app registers (job, events, logs, metrics, charts, artifacts, usage);
a read-only token of a member cannot preview, confirm or cancel; the member's full token can cancel."""

from __future__ import annotations

import re
import uuid

import httpx
import pytest

from tests.artifact_fixtures import serve_app
from tests.conftest import free_port
from tests.e2e.launch_cluster import MIB, Cluster
from tests.submission_setup import add_user
from tuneplane.app.security import new_token
from tuneplane.app.web import create_app

pytestmark = pytest.mark.e2e


def _token(cluster: Cluster, user: int, read_only: bool = False) -> dict:
    plaintext, digest = new_token("tpu")
    cluster.db.call("issue_scoped_api_token", user, "e2e", digest, None, [], read_only)
    return {"Authorization": f"Bearer {plaintext}", "Accept": "application/json"}


def _job_routes(app) -> list[tuple[str, str]]:
    """(method, path template) of every route that names a job by its id."""
    routes = []
    for rule in app.url_map.iter_rules():
        if "job_id" in rule.arguments and not rule.arguments - {"job_id"}:
            for method in sorted(rule.methods - {"HEAD", "OPTIONS"}):
                routes.append((method, re.sub(r"<(?:\w+:)?job_id>", "{job_id}", rule.rule)))
    return routes


def test_viewer_outsider_and_read_only_token_over_real_http_with_a_real_agent(cluster: Cluster) -> None:
    db, alice = cluster.db, cluster.user_id
    bob, carol, dave = (add_user(db, name) for name in ("bob", "carol", "dave"))
    vision = db.call("create_team", alice, "vision")[0]["id"]
    db.call("set_team_member", alice, vision, bob, "member")
    db.call("set_team_member", alice, vision, carol, "viewer")
    db.call("create_team", dave, "nlp")  # dave is in other teams only
    cluster.start_agent("a")
    cluster.start_worker()
    archive = cluster.upload_source({"wait.py": "import time\nprint('up', flush=True)\ntime.sleep(120)\n"})
    job_id = cluster.submit(
        {
            "team": "vision",
            "source": {"archive": archive, "entrypoint": "python wait.py", "integration": "script"},
            "resources": {"nodes": 1, "gpus_per_node": 0, "cpus_per_node": 1, "memory_per_node": 64 * MIB},
        }
    )
    cluster.wait_job(job_id, ("running",), timeout=90)

    app = create_app(cluster.db_url, config={"SECRET_KEY": "e2e", "TP_DATA_DIR": str(cluster.data_dir)})
    with serve_app(app, free_port()) as url, httpx.Client(base_url=url, timeout=30) as http:
        viewer, outsider = _token(cluster, carol), _token(cluster, dave)
        member, member_read_only = _token(cluster, bob), _token(cluster, bob, read_only=True)
        # The viewer sees the job, and cannot cancel it.
        assert http.get(f"/jobs/{job_id}", headers=viewer).status_code == 200
        refused = http.post(f"/jobs/{job_id}/cancel", json={}, headers=viewer)
        assert refused.status_code == 403, refused.text
        assert "viewer" in refused.json()["error"]
        # A member of other teams: 404 on every job-scoped route, as for a job that does not exist.
        walked = _job_routes(app)
        assert len(walked) > 10
        for method, template in walked:
            answer = http.request(
                method,
                template.format(job_id=job_id),
                headers=outsider,
                # A reason only where the view reads one: the others refuse an unknown field (400) first.
                json={"reason": "e2e"} if template.endswith(("/cancel", "/exempt-idle")) else {},
                params={"series": "1"},  # what a client of the raw scalar inspector always sends
            )
            # exempt-idle and preempt are for installation admins only: 403 to any other user, any job.
            expected = 403 if template.endswith(("/exempt-idle", "/preempt")) else 404
            assert answer.status_code == expected, (method, template, answer.status_code, answer.text[:200])
        assert http.get("/usage", params={"team": "vision"}, headers=outsider).status_code == 404
        assert http.get(f"/charts/compare?jobs={job_id}", headers=outsider).status_code == 404
        # A member's read-only token: reads, but cannot preview, confirm or cancel.
        assert http.get(f"/jobs/{job_id}", headers=member_read_only).status_code == 200
        spec = {"team": "vision", "fleet": cluster.fleet, "recipe": {"name": "demo", "params": {"steps": 1}}}
        assert http.post("/previews", json=spec, headers=member_read_only).status_code == 403
        preview = http.post("/previews", json=spec, headers=member)
        assert preview.status_code == 201, preview.text
        body = preview.json()
        confirm = {"digest": body["digest"], "retry_key": str(uuid.uuid4())}
        assert (
            http.post(f"/previews/{body['id']}/confirm", json=confirm, headers=member_read_only).status_code
            == 403
        )
        assert http.post(f"/jobs/{job_id}/cancel", json={}, headers=member_read_only).status_code == 403
        assert cluster.job(job_id)["state"] == "running"
        # The member's full token cancels the team's job.
        assert http.post(f"/jobs/{job_id}/cancel", json={}, headers=member).status_code == 200
    assert cluster.wait_job(job_id, ("cancelled",), timeout=60)["state"] == "cancelled"
