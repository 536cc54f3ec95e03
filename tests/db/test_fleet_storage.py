"""A fleet's storage (issue 32, migration 0245): `filesystem` (the default) or an S3 location, set by an admin
through POST /fleets (`tuneplane fleet create --storage s3://… --s3-endpoint …`), shown on the Fleet page
and in the JSON; every field checked (400 naming it); credentials can never be stored with a fleet."""

from __future__ import annotations

import pytest
from psycopg.types.json import Jsonb

from tests.db.test_fleet_web import _user
from tuneplane.app.cli.fleet_cmd import storage_words
from tuneplane.app.db import Database
from tuneplane.app.errors import Refusal
from tuneplane.app.web import create_app


def test_admin_creates_an_s3_fleet_and_the_page_and_json_show_it(db_url: str, db: Database) -> None:
    admin_id, headers = _user(db, "root", "admin")
    client = create_app(db_url).test_client()
    body = {"name": "gpu-s3", "storage": "s3://ckpt-bucket/team-a/", "s3_endpoint": "http://127.0.0.1:8333"}
    created = client.post("/fleets", json=body, headers=headers)
    assert created.status_code == 201, created.get_data(as_text=True)
    storage = created.get_json()["storage"]
    assert storage == {"kind": "s3", "bucket": "ckpt-bucket", "prefix": "team-a", "region": "us-east-1",
                       "endpoint": "http://127.0.0.1:8333", "addressing_style": "path"}  # fmt: skip
    assert storage_words(storage) == "s3://ckpt-bucket/team-a at http://127.0.0.1:8333"
    plain = client.post("/fleets", json={"name": "plain"}, headers=headers)
    assert plain.status_code == 201 and plain.get_json()["storage"] is None
    assert storage_words(None) == "filesystem"
    shown = client.get("/fleets/gpu-s3", headers=headers).get_json()["fleet"]
    assert shown["storage"]["bucket"] == "ckpt-bucket"
    with client.session_transaction() as session:
        session["user_id"] = admin_id
    html = client.get("/fleets").get_data(as_text=True)
    assert "storage s3://ckpt-bucket/team-a at http://127.0.0.1:8333" in html
    assert 'data-storage="filesystem"' in html and 'name="storage"' in html
    events = db.fetch_all("SELECT kind, reason FROM v_node_events WHERE fleet = 'gpu-s3' ORDER BY id")
    assert events[-1] == {"kind": "fleet_storage", "reason": "s3://ckpt-bucket/team-a"}


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"storage": "gs://bucket/x"}, "storage"),
        ({"storage": "s3://Bad_Bucket/x"}, "storage"),
        ({"storage": "s3://bucket/../x"}, "storage"),
        # Once passed by the request's own check (Python's `$` before a newline); refused now by both it and
        # set_fleet_storage's, and the fleet is created with its storage in one transaction anyway.
        ({"storage": "s3://bucket\n/x"}, "storage"),
        ({"storage": "s3://bucket", "s3_region": "US East"}, "s3_region"),
        ({"storage": "s3://bucket", "s3_endpoint": "ftp://host"}, "s3_endpoint"),
        # Plain HTTP off loopback: nodes refuse it for capsules, inputs and resumes (found walking issue 32).
        ({"storage": "s3://bucket", "s3_endpoint": "http://minio.lan:9000"}, "s3_endpoint"),
        ({"storage": "s3://bucket", "s3_addressing_style": "dns"}, "s3_addressing_style"),
        ({"s3_endpoint": "http://127.0.0.1:9000"}, "s3_endpoint"),
    ],
)
def test_bad_storage_is_a_400_naming_the_field_and_creates_nothing(
    db_url: str, db: Database, body: dict, field: str
) -> None:
    _, headers = _user(db, "root", "admin")
    client = create_app(db_url).test_client()
    refused = client.post("/fleets", json={"name": "f1", **body}, headers=headers)
    assert refused.status_code == 400, refused.get_data(as_text=True)
    assert list(refused.get_json()["fields"]) == [field]
    assert db.fetch_all("SELECT 1 FROM fleets WHERE name = 'f1'") == []


def test_set_fleet_storage_refuses_credentials_and_bad_fields(db: Database) -> None:
    db.call("create_fleet", "f2", "node", Jsonb({}), None)
    for storage, words in (
        ({"kind": "s3", "bucket": "b-1", "secret_access_key": "x"}, "no field secret_access_key"),
        ({"kind": "gcs", "bucket": "b-1"}, "kind must be filesystem or s3"),
        ({"kind": "s3", "bucket": "B"}, "bucket"),
        ({"kind": "s3", "bucket": "b-1", "endpoint": "file:///x"}, "endpoint"),
        ({"kind": "s3", "bucket": "b-1", "prefix": "a/../b"}, "prefix"),
        (
            {"kind": "s3", "bucket": "b-1", "endpoint": "http://10.0.0.5:9000"},
            "plain http:// only to a loopback",
        ),
        ({"kind": "s3", "bucket": "b-1", "endpoint": "http://127.0.0.1.lan:9000"}, "only to a loopback"),
    ):
        with pytest.raises(Refusal, match=words):
            db.call("set_fleet_storage", "f2", Jsonb(storage), "user:t")
    with pytest.raises(Refusal, match="no fleet named"):
        db.call("set_fleet_storage", "nope", Jsonb({"kind": "filesystem"}), "user:t")
    row = db.call("set_fleet_storage", "f2", Jsonb({"kind": "s3", "bucket": "b-1"}), "user:t")[0]
    assert row["storage"] == {"kind": "s3", "bucket": "b-1"}
    assert db.call("set_fleet_storage", "f2", Jsonb({"kind": "filesystem"}), "user:t")[0]["storage"] is None
    for endpoint in (
        "http://127.0.0.1:9000",
        "http://localhost:9000/",
        "http://[::1]:9000",
        "https://s3.lan",
    ):
        row = db.call(
            "set_fleet_storage", "f2", Jsonb({"kind": "s3", "bucket": "b-1", "endpoint": endpoint})
        )[0]
        assert row["storage"]["endpoint"] == endpoint


def test_setting_a_fleets_storage_does_not_hold_up_its_new_nodes_and_jobs(db_url: str, db: Database) -> None:
    """set_fleet_storage locks the fleet row FOR NO KEY UPDATE, as every other writer of a fleet row does
    (nodes.sql's lock order): a node enrolled or a job placed meanwhile takes KEY SHARE on it (their
    foreign key) and goes on; FOR UPDATE made them wait for the admin's transaction."""
    from tests.launch_fixtures import make_fleet, make_node
    from tuneplane.app.db import connect

    fleet = make_fleet(db, "gpu")
    with connect(db_url) as admin:
        admin.execute(
            "SELECT set_fleet_storage('gpu', %s, 'test')", (Jsonb({"kind": "s3", "bucket": "ckpt"}),)
        )
        with db.transaction() as conn:  # the admin's transaction is still open
            conn.execute("SET LOCAL lock_timeout = '3s'")
            conn.execute(
                "INSERT INTO nodes (fleet_id, name, cpus, memory_bytes) VALUES (%s, 'n9', 4, 0)", (fleet,)
            )
        make_node(db, fleet, "n10")
        admin.commit()
    assert db.fetch_one("SELECT storage ->> 'bucket' AS b FROM fleets WHERE id = %s", (fleet,))["b"] == "ckpt"


def test_a_fleets_store_does_not_change_while_it_holds_artifacts(db: Database, tmp_path) -> None:
    """An artifact's bytes are looked for in its fleet's store (artifact_storage): a store changed under
    them would lose them from sight. A fleet holding an artifact refuses the change (409, field storage);
    setting the same store again, or a new fleet, is fine."""
    from tests.artifact_fixtures import make_member, recorded_complete, write_tree

    setup = make_member(db)
    s3 = {"kind": "s3", "bucket": "ckpt", "prefix": "a"}
    recorded_complete(db, setup, "out", write_tree(tmp_path / "out", {"a.txt": b"a"}))
    with pytest.raises(Refusal, match=r"fleet gpu holds 1 artifact\(s\) in its store \(filesystem\)") as held:
        db.call("set_fleet_storage", "gpu", Jsonb(s3), "user:t")
    assert held.value.status == 409 and held.value.field == "storage"
    assert db.fetch_one("SELECT storage FROM fleets WHERE name = 'gpu'")["storage"] is None
    # The same store again is no change.
    assert db.call("set_fleet_storage", "gpu", Jsonb({"kind": "filesystem"}), "user:t")[0]["storage"] is None
    db.call("create_fleet", "gpu2", "node", Jsonb({}), None)
    assert db.call("set_fleet_storage", "gpu2", Jsonb(s3), "user:t")[0]["storage"] == s3
    with pytest.raises(Refusal, match="region"):
        db.call("set_fleet_storage", "gpu2", Jsonb({**s3, "region": "US East\n"}), "user:t")


def test_the_cli_refuses_an_s3_endpoint_without_an_s3_storage(cli, db: Database) -> None:
    """`fleet create gpu --s3-endpoint URL` with the `--storage s3://…` forgotten once made a filesystem
    fleet without a word (the CLI dropped the endpoint); the server's refusal now reaches the user."""
    result = cli("fleet", "create", "gpu", "--s3-endpoint", "http://127.0.0.1:8333", user="root")
    assert result.exit_code != 0, result.output
    assert "--s3-endpoint needs an s3:// storage" in result.output
    region = cli("fleet", "create", "gpu", "--s3-region", "eu-west-1", user="root")
    assert region.exit_code == 2 and "--s3-region needs --storage s3://" in region.output, region.output
    assert db.fetch_all("SELECT 1 FROM fleets WHERE name = 'gpu'") == []
