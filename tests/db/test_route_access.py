"""Every route the console and both gateways register, walked: a route that names a job (or an artifact or a
preview of one) answers 404 to a user who may not see it, exactly as for a job that does not exist.

The rule itself is require_job_access (sql/functions/access.sql). This test keeps routes from forgetting
it: a route is job-scoped when it takes job_id, artifact_id or preview_id (or a job list in its query),
and then it is requested as another user (404 expected) and as the owner (anything but 404, so the 404
is the rule's and not a bad URL). Every other route must be in NOT_JOB_SCOPED with the reason, so a new
route is either checked here or explained here.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from flask import Flask
from flask.testing import FlaskClient

from tests.artifact_fixtures import api_token, make_member, recorded_complete, write_tree
from tests.launch_fixtures import make_user
from tuneplane.app.db import Database
from tuneplane.app.security import new_token
from tuneplane.app.web import create_app

SCOPE_ARGS = {"job_id", "artifact_id", "preview_id"}
# Routes that name their jobs in the query string, not the path: rule -> query.
QUERY_SCOPED = {"/charts/compare": {"jobs": "{job_id}"}}
# Extra query a job-scoped route needs to reach its access check (what a real client always sends).
QUERY = {"/jobs/<int:job_id>/metrics/raw": {"series": "1"}}
# A body a job-scoped route needs to reach its access check (what a real client always sends).
BODY = {"/jobs/<job_id>/exempt-idle": {"reason": "route walk"}}
# Admin-only job routes answer 403 to every non-admin, whatever the job (so nothing about the job leaks).
ADMIN_ONLY = {
    "/jobs/<job_id>/exempt-idle": "exempt_job_idle asks require_admin first",
    "/jobs/<job_id>/preempt": "preempting a job asks require_admin first",
}
# The owner's own request may answer 404 for a reason that is not access; said here.
OWNER_404 = {
    "/jobs/<int:job_id>/metrics/raw": "series 1 does not exist: the job has no telemetry in this test",
}

NODE = "a node credential, not a user: the node may touch only what its own members hold " \
       "(tests/db/test_artifacts_gateway.py, test_artifacts_unhappy.py)"  # fmt: skip
TEAM = "a team, not a job: team_read_of/team_admin_of answer 404 to a user with no role in it " \
       "(tests/db/test_team_pages.py)"  # fmt: skip
NOT_JOB_SCOPED = {
    # console
    "/static/<path:filename>": "static files",
    "/healthz": "liveness, no data",
    "/login": "logs in",
    "/logout": "logs out",
    "/api/tokens": "issues a token to the user who logs in with it",
    "/": "home page: the user's own summary",
    "/jobs": "the list is filtered by job_access_allowed (checked below: another's job is not listed)",
    "/plugins": "installed plugins, no job data",
    "/submit": "the submit form",
    "/previews": "creates a preview for the caller",
    "/sources": "uploads a source archive for the caller",
    "/fleets": "fleets (admin to create: require_admin)",
    "/fleets/<name>": "one fleet, no job data",
    "/fleets/<name>/enrollment-tokens": "admin only (require_admin)",
    "/fleets/<name>/access": "team access, no job data (installation admins: set_fleet_access_mode)",
    "/fleets/<name>/team-access": "a team's grant on a fleet (installation admins: set_fleet_team_access)",
    "/fleets/<name>/idle-policy": "a fleet's idle policy, no job data; admins only to set (set_idle_policy)",
    "/nodes/fence": "admin only (require_admin)",
    "/nodes/scheduling": "admin only (require_admin)",
    "/teams": "the caller's teams",
    "/teams/<name>": TEAM,
    "/teams/<name>/members": TEAM,
    "/teams/<name>/quotas": "installation admins only (set_team_quota)",
    "/teams/<name>/priority": "installation admins only (set_team_priority_grant)",
    "/teams/<name>/webhooks": TEAM,
    "/teams/<name>/webhooks/<int:webhook_id>/remove": TEAM,
    "/usage": "usage of the teams the caller may see (usage_report/usage_teams_of, team-scoped)",
    "/usage.csv": "the same table as /usage, as CSV",
    "/usage/prices": "prices per GPU-hour per fleet (installation admins set them: set_usage_price)",
    "/tokens": "the caller's own API tokens (tokens_of, issue_scoped_api_token)",
    "/tokens/<int:token_id>/revoke": "one of the caller's own tokens (revoke_api_token: 404 for another's)",
    "/api/artifacts": NODE,
    "/api/artifacts/refused": NODE,
    "/api/artifacts/<int:artifact_id>/upload": NODE,
    "/api/artifacts/<int:artifact_id>/files/<int:file_index>/chunks/<int:chunk_index>": NODE,
    "/api/artifacts/<int:artifact_id>/finish": NODE,
    "/api/artifacts/<int:artifact_id>/fail": NODE,
    "/api/input-artifacts/<int:artifact_id>": NODE,
    "/api/input-artifacts/<int:artifact_id>/files/<int:file_index>": NODE,
    "/api/input-artifacts/<int:artifact_id>/files/<int:file_index>/mismatch": NODE,
}
# POST routes that only read the job (its 'read' right is enough).
READ_BY_POST = {"/artifacts/<int:artifact_id>/verify": "checks the stored files against the manifest"}
TELEMETRY = "a member's telemetry token: it writes or reads only its own member's scope " \
            "(tests/db/test_telemetry_gateway.py)"  # fmt: skip
GATEWAY_NOT_JOB_SCOPED = {
    "telemetry": {
        "/v1/telemetry/batches": TELEMETRY,
        "/v1/telemetry/points": TELEMETRY,
        "/v1/telemetry/scope": TELEMETRY,
        "/healthz": "liveness, no data",
    },
    "node": {
        "/v1/enroll": "an enrollment token makes a node; no job",
        "/v1/stats": "the gateway's counters, to a loopback peer only; no job",
        "/v1/control": "the node's control session (node credential): its own members only "
        "(tests/db/test_node_gateway.py)",
        "/v1/reports": "the node's reports (node credential): member_of_node refuses another node's "
        "member (tests/db/test_node_sql.py)",
        "/v1/files/{kind}/{name}": "capsules and runtimes for the node's own members "
        "(node_may_read_capsule; tests/db/test_capsule_provider.py)",
        "/healthz": "liveness, no data",
        "/api/artifacts": NODE,
        "/api/artifacts/refused": NODE,
        "/api/artifacts/{artifact_id}/upload": NODE,
        "/api/artifacts/{artifact_id}/files/{file_index}/chunks/{chunk_index}": NODE,
        "/api/artifacts/{artifact_id}/files/{file_index}/s3/{step}": NODE,
        "/api/artifacts/{artifact_id}/finish": NODE,
        "/api/artifacts/{artifact_id}/fail": NODE,
        "/api/input-artifacts/{artifact_id}": NODE,
        "/api/input-artifacts/{artifact_id}/files/{file_index}": NODE,
        "/api/input-artifacts/{artifact_id}/files/{file_index}/mismatch": NODE,
    },
}


@pytest.fixture
def app(db_url: str, tmp_path: Path) -> Flask:
    return create_app(
        db_url,
        config={"SECRET_KEY": "t", "TP_DATA_DIR": str(tmp_path / "data"), "TP_BLOB_DIR": str(tmp_path / "b")},
    )


@pytest.fixture
def world(db: Database, tmp_path: Path) -> dict:
    """alice's job with a complete artifact and the preview it came from; bob, who may see none of it."""
    setup = make_member(db)
    manifest = write_tree(tmp_path / "out", {"weights.bin": b"w" * 10})
    artifact = recorded_complete(db, setup, "model", manifest)
    preview = db.fetch_one("SELECT preview_id, digest FROM v_jobs WHERE id = %s", (setup.job_id,))
    bob = make_user(db, "bob")
    return {
        "values": {
            "job_id": setup.job_id,
            "artifact_id": artifact["id"],
            "preview_id": str(preview["preview_id"]),
            "name": "model",
            "file_index": 0,
        },
        "digest": preview["digest"],
        "alice": {"Authorization": f"Bearer {api_token(db, setup.user_id)}", "Accept": "application/json"},
        "bob": {"Authorization": f"Bearer {api_token(db, bob)}", "Accept": "application/json"},
    }


def _normalised(rule: str) -> str:
    """aiohttp's canonical path without its regular expressions: {artifact_id:\\d{1,18}} -> {artifact_id}."""
    return re.sub(r"\{(\w+):[^{}]*(\{[^{}]*\}[^{}]*)*\}", r"{\1}", rule)


def _job_scoped(app: Flask) -> list:
    rules = [r for r in app.url_map.iter_rules() if r.rule not in NOT_JOB_SCOPED]
    unexplained = [r.rule for r in rules if not (r.arguments & SCOPE_ARGS) and r.rule not in QUERY_SCOPED]
    assert unexplained == [], (
        "routes that take no job_id/artifact_id/preview_id: add each to NOT_JOB_SCOPED with the reason, "
        "or make it job-scoped"
    )
    return rules


def test_every_console_route_is_job_scoped_and_checked_or_explained(app: Flask) -> None:
    registered = {r.rule for r in app.url_map.iter_rules()}
    assert sorted(set(NOT_JOB_SCOPED) - registered) == [], "NOT_JOB_SCOPED names routes that no longer exist"
    assert len(_job_scoped(app)) >= 15


def _request(client: FlaskClient, rule, values: dict, headers: dict, digest: str):
    method = sorted(rule.methods - {"HEAD", "OPTIONS"})[0]
    path = rule.rule
    for arg in rule.arguments:
        path = path.replace(f"<{arg}>", str(values[arg])).replace(f"<int:{arg}>", str(values[arg]))
    query = {
        k: v.format(**values)
        for k, v in {**QUERY_SCOPED.get(rule.rule, {}), **QUERY.get(rule.rule, {})}.items()
    }
    body = {"digest": digest} if path.endswith("/confirm") else BODY.get(rule.rule, {})
    if method == "GET":
        return method, path, client.get(path, query_string=query, headers=headers)
    return method, path, client.open(path, method=method, query_string=query, json=body, headers=headers)


def test_every_job_scoped_console_route_answers_404_to_a_user_who_may_not_see_the_job(
    app: Flask, world: dict
) -> None:
    client = app.test_client()
    rules = _job_scoped(app)
    leaks = []
    for rule in rules:
        method, path, answer = _request(client, rule, world["values"], world["bob"], world["digest"])
        if answer.status_code != (403 if rule.rule in ADMIN_ONLY else 404):
            leaks.append(f"{method} {path} -> {answer.status_code} {answer.get_data(as_text=True)[:200]}")
    assert leaks == [], "job-scoped routes that do not ask require_job_access:\n" + "\n".join(leaks)
    # The list is filtered by the same rule: bob's list does not hold alice's job.
    listed = client.get("/jobs", headers=world["bob"]).get_json()["jobs"]
    assert world["values"]["job_id"] not in [j["id"] for j in listed]
    # The owner is answered (so bob's 404 came from the rule, not from a URL that matches nothing). Reads
    # first; the requests that change the job (cancel, confirm) last.
    for rule in sorted(rules, key=lambda r: "GET" not in r.methods):
        if rule.rule in OWNER_404:
            continue
        method, path, answer = _request(client, rule, world["values"], world["alice"], world["digest"])
        assert answer.status_code != 404, (
            f"{method} {path} as the owner: {answer.get_data(as_text=True)[:300]}"
        )


def test_every_gateway_route_is_explained(db_url: str, tmp_path: Path) -> None:
    from tuneplane.app.node_gateway.aiodb import AsyncDatabase
    from tuneplane.app.node_gateway.server import Gateway
    from tuneplane.app.telemetry.gateway import create_app as telemetry_app

    apps = {
        "telemetry": telemetry_app(db_url),
        "node": Gateway(AsyncDatabase(db_url), blob_dir=tmp_path / "blobs").make_app(),
    }
    try:
        for name, gateway in apps.items():
            routes = {_normalised(r.resource.canonical) for r in gateway.router.routes() if r.resource}
            assert sorted(routes - set(GATEWAY_NOT_JOB_SCOPED[name])) == [], (
                f"{name} gateway: a route no user reaches must say why in GATEWAY_NOT_JOB_SCOPED; one a user "
                "reaches must ask require_job_access and be walked like the console's"
            )
            assert sorted(set(GATEWAY_NOT_JOB_SCOPED[name]) - routes) == [], f"{name}: stale entries"
    finally:
        from tuneplane.app.artifacts.gateway_routes import RECEIVER_KEY

        receiver = apps["node"].get(RECEIVER_KEY)
        if receiver is not None:
            receiver.db.close()


def test_a_viewer_and_a_read_only_token_read_every_job_scoped_route_and_change_nothing(
    app: Flask, world: dict, db: Database
) -> None:
    """Teams and token scopes through the same walk: a viewer of the job's team and the owner's read-only
    token are answered on every read, and every request that would change something is refused (403)."""
    client = app.test_client()
    owner = db.fetch_one("SELECT owner_id, team_id FROM jobs WHERE id = %s", (world["values"]["job_id"],))
    carol = make_user(db, "carol")
    db.call("set_team_member", owner["owner_id"], owner["team_id"], carol, "viewer")
    plaintext, digest = new_token("tpu")
    db.call("issue_scoped_api_token", owner["owner_id"], "ro", digest, None, [], True)
    read_only = {"Authorization": f"Bearer {plaintext}", "Accept": "application/json"}
    viewer = {"Authorization": f"Bearer {api_token(db, carol)}", "Accept": "application/json"}
    wrong = []
    for who, headers in (("viewer", viewer), ("read-only token", read_only)):
        for rule in _job_scoped(app):
            if rule.rule in OWNER_404 or ("preview_id" in rule.arguments and who == "viewer"):
                continue  # a preview is its owner's alone (get_preview); the viewer is refused it (404)
            method, path, answer = _request(client, rule, world["values"], headers, world["digest"])
            expected_ok = method == "GET" or rule.rule in READ_BY_POST
            if (expected_ok and answer.status_code == 404) or (not expected_ok and answer.status_code != 403):
                wrong.append(
                    f"{who}: {method} {path} -> {answer.status_code} {answer.get_data(as_text=True)[:150]}"
                )
    assert wrong == []
    assert (
        db.fetch_one("SELECT state FROM jobs WHERE id = %s", (world["values"]["job_id"],))["state"]
        != "cancelled"
    )
