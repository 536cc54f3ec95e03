"""The Usage page, its CSV export and its JSON (app/web/usage.py): the CSV is exactly the table shown."""

from __future__ import annotations

import csv
import io
import json
from html.parser import HTMLParser

import pytest

from tests.console_server import api_token, cli_invoker, serving_console
from tests.launch_fixtures import make_fleet, make_job, make_node, report, run_to_running
from tuneplane.app.db import Database
from tuneplane.app.security import hash_password, new_token
from tuneplane.app.web import create_app


class _Table(HTMLParser):
    """The cells of the page's #usage-table, as the browser shows them."""

    def __init__(self) -> None:
        super().__init__()
        self.rows: list[list[str]] = []
        self._inside = False
        self._cell: list[str] | None = None

    def handle_starttag(self, tag: str, attrs: list) -> None:
        if tag == "table" and ("id", "usage-table") in attrs:
            self._inside = True
        elif self._inside and tag == "tr":
            self.rows.append([])
        elif self._inside and tag in ("td", "th"):
            self._cell = []

    def handle_endtag(self, tag: str) -> None:
        if tag == "table":
            self._inside = False
        elif self._inside and tag in ("td", "th") and self._cell is not None:
            self.rows[-1].append("".join(self._cell).strip())
            self._cell = None

    def handle_data(self, data: str) -> None:
        if self._cell is not None:
            self._cell.append(data)


def _user(db: Database, name: str, role: str = "user") -> tuple[int, dict]:
    user = db.call("create_user", name, hash_password("pw"), role)[0]
    plaintext, digest = new_token("tpu")
    db.call("issue_api_token", user["id"], "test", digest, None)
    return user["id"], {"Authorization": f"Bearer {plaintext}", "Accept": "application/json"}


def _used(db: Database, users: list[int]) -> None:
    """Each user runs one job to its end (alice 2 GPUs, bob 1), so the ledger has a row per team."""
    fleet = make_fleet(db)
    make_node(db, fleet, "n0", gpus=4)
    jobs = [make_job(db, u, fleet, gpus_per_node=g) for u, g in zip(users, (2, 1), strict=False)]
    db.call("reserve_next", fleet, 10)
    for job_id in jobs:
        for m in run_to_running(db, job_id):
            report(db, "member_exited", m, exit_code=0)


@pytest.mark.parametrize("by", ["team", "user", "job", "day"])
def test_csv_export_equals_the_table_the_page_shows(db_url: str, db: Database, by: str) -> None:
    admin, _ = _user(db, "root", "admin")
    alice, _ = _user(db, "alice")
    bob, _ = _user(db, "bob")
    _used(db, [alice, bob])
    db.call("set_usage_price", admin, "gpu", None, 2, "EUR")
    client = create_app(db_url).test_client()
    with client.session_transaction() as session:
        session["user_id"] = admin
    page = client.get(f"/usage?by={by}&since=1d")
    assert page.status_code == 200
    html = page.get_data(as_text=True)
    assert "<title>Usage · TunePlane</title>" in html and html.count("Prices per GPU-hour") == 1
    parsed = _Table()
    parsed.feed(html)
    exported = client.get(f"/usage.csv?by={by}&since=1d")
    assert exported.status_code == 200 and exported.mimetype == "text/csv"
    rows = list(csv.reader(io.StringIO(exported.get_data(as_text=True))))
    assert rows == parsed.rows
    assert len(rows) == 3  # the header and one line per team
    teams = [r[rows[0].index("team")] for r in rows[1:]]
    assert sorted(teams) == ["alice", "bob"]
    assert all(r[-1].endswith(" EUR") for r in rows[1:])


def test_a_user_sees_only_their_teams_usage_and_json_says_the_same(db_url: str, db: Database) -> None:
    alice, alice_headers = _user(db, "alice")
    bob, _ = _user(db, "bob")
    _used(db, [alice, bob])
    client = create_app(db_url).test_client()
    shown = client.get("/usage?by=user&since=1d", headers=alice_headers).get_json()
    assert [r[:2] for r in shown["table"]["rows"]] == [["alice", "alice"]]
    assert [t["team"] for t in shown["chart"]["teams"]] == ["alice"]
    refused = client.get("/usage?team=bob", headers=alice_headers)
    assert refused.status_code == 404 and "team" in refused.get_json()["fields"]


@pytest.mark.parametrize(
    ("query", "field"), [("by=week", "by"), ("since=yesterday", "since"), ("until=2026-13-01", "until"),
                         ("since=2999-01-01", "since")]
)  # fmt: skip
def test_bad_questions_are_400_naming_the_field(db_url: str, db: Database, query: str, field: str) -> None:
    _alice, headers = _user(db, "alice")
    client = create_app(db_url).test_client()
    for path in ("/usage", "/usage.csv"):
        answer = client.get(f"{path}?{query}", headers=headers)
        assert answer.status_code == 400, (path, query)
        assert field in answer.get_json()["fields"]


def test_a_token_scoped_to_one_team_reads_only_that_teams_usage(db_url: str, db: Database) -> None:
    admin, headers = _user(db, "root", "admin")
    alice, _ = _user(db, "alice")
    bob, _ = _user(db, "bob")
    _used(db, [alice, bob])
    client = create_app(db_url).test_client()
    everyone = client.get("/usage?since=1d", headers=headers).get_json()
    assert sorted(r[0] for r in everyone["table"]["rows"]) == ["alice", "bob"]
    db.fetch_all(  # test setup: narrow the admin's token to team alice (as `tuneplane token create --team`)
        """INSERT INTO api_token_teams (token_id, team_id)
           SELECT t.id, (SELECT id FROM teams WHERE name = 'alice') FROM api_tokens t WHERE t.user_id = %s
           RETURNING 1""",
        (admin,),
    )
    narrowed = client.get("/usage?since=1d", headers=headers).get_json()
    assert [r[0] for r in narrowed["table"]["rows"]] == ["alice"]
    assert client.get("/usage?team=bob", headers=headers).status_code == 404


def test_tuneplane_usage_prints_the_table_and_with_csv_the_export(
    db_url: str, db: Database, tmp_path, port: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    alice, _ = _user(db, "alice")
    bob, _ = _user(db, "bob")
    _used(db, [alice, bob])
    with serving_console(db_url, tmp_path, port) as url:
        run = cli_invoker(monkeypatch, tmp_path, url, {"alice": api_token(db, alice)})
        table = run("usage", "--by", "user", "--since", "1d")
        assert table.exit_code == 0, table.output
        lines = table.output.splitlines()
        assert lines[0].split()[:3] == ["TEAM", "USER", "MEMBERS"] and len(lines) == 2
        assert lines[1].split()[:3] == ["alice", "alice", "1"]
        exported = run("usage", "--by", "user", "--since", "1d", "--csv")
        client = create_app(db_url).test_client()
        with client.session_transaction() as session:
            session["user_id"] = alice
        assert exported.output == client.get("/usage.csv?by=user&since=1d").get_data(as_text=True)
        refused = run("usage", "--team", "bob")
        assert refused.exit_code == 1 and "no team bob of yours" in refused.output


def test_an_installation_admin_sets_a_price_and_the_page_shows_the_cost(db_url: str, db: Database) -> None:
    _admin, admin_h = _user(db, "root", "admin")
    alice, alice_h = _user(db, "alice")
    _used(db, [alice])
    client = create_app(db_url).test_client()
    denied = client.post("/usage/prices", json={"fleet": "gpu", "price": "3"}, headers=alice_h)
    assert denied.status_code == 403
    bad = client.post("/usage/prices", json={"fleet": "gpu", "price": "-1"}, headers=admin_h)
    assert bad.status_code == 400 and "price" in bad.get_json()["fields"]
    ok = client.post("/usage/prices", json={"fleet": "gpu", "price": "3", "currency": "EUR"}, headers=admin_h)
    assert ok.get_json()["prices"][0]["currency"] == "EUR"
    row = client.get("/usage?since=1d", headers=alice_h).get_json()["table"]["rows"][0]
    assert row[-1].endswith(" EUR")
    removed = client.post("/usage/prices", json={"fleet": "gpu", "price": ""}, headers=admin_h)
    assert removed.get_json()["prices"] == []


def test_a_token_requests_scope_does_not_outlive_the_request(db_url: str, db: Database) -> None:
    from tuneplane.app.db import request_token_id

    _alice, headers = _user(db, "alice")
    client = create_app(db_url).test_client()
    assert client.get("/usage", headers=headers).status_code == 200
    # The test's own database calls after the request (same thread) act under no token.
    assert request_token_id.get() is None
    assert db.fetch_one("SELECT request_token() AS t")["t"] is None


def test_a_short_job_shows_its_gpu_and_cpu_seconds_as_integers_in_json_csv_and_the_cli(
    db_url: str, db: Database, tmp_path, port: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Hours to three decimals blur a 7-second job (0.004 h); the seconds beside them do not (issue 34)."""
    alice, headers = _user(db, "alice")
    _used(db, [alice])  # one member, 2 GPUs, 1 CPU
    db.fetch_all(  # test setup: the member ran 7.4 s, a minute ago
        "UPDATE usage_ledger SET started_at = now() - interval '60.4 seconds',"
        " ended_at = now() - interval '53 seconds' RETURNING 1"
    )
    client = create_app(db_url).test_client()
    table = client.get("/usage?since=1d", headers=headers).get_json()["table"]
    row = dict(zip(table["columns"], table["rows"][0], strict=True))
    assert row["GPU-seconds"] == 15 and row["CPU-seconds"] == 7  # 2 x 7.4 = 14.8, 1 x 7.4: whole, half up
    assert row["GPU-hours"] == "0.004" and row["CPU-hours"] == "0.002"
    assert table["columns"].index("GPU-seconds") == table["columns"].index("GPU-hours") + 1
    csv_text = client.get("/usage.csv?since=1d", headers=headers).get_data(as_text=True)
    exported = list(csv.reader(io.StringIO(csv_text)))
    assert dict(zip(exported[0], exported[1], strict=True))["GPU-seconds"] == "15"
    with serving_console(db_url, tmp_path, port) as url:
        run = cli_invoker(monkeypatch, tmp_path, url, {"alice": api_token(db, alice)})
        printed = run("usage", "--since", "1d")
        assert printed.exit_code == 0, printed.output
        header, line = printed.output.splitlines()
        assert "GPU-SECONDS" in header and "CPU-SECONDS" in header
        # Columns are left-aligned under their headers (some headers have spaces: read by position).
        assert line[header.index("GPU-SECONDS") :].split()[0] == "15"
        assert line[header.index("CPU-SECONDS") :].split()[0] == "7"
        shown = json.loads(run("usage", "--since", "1d", "--json").output)["table"]
        assert dict(zip(shown["columns"], shown["rows"][0], strict=True))["GPU-seconds"] == 15
