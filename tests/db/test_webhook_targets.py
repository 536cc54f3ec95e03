"""The webhook target policy (app/webhook_targets.py, issue 38): a webhook reaches only public addresses
or what the operator allowed, checked at registration and again where the delivery connects (the resolved
address, so a name that later resolves to a private address is refused too), and a team admin sees only
a coarse class of a failed try. No test here opens a socket to anything but loopback: every connect is
checked by `no_outside_connects`, and names resolve through a stub resolver, never DNS."""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest
from flask.testing import FlaskClient

from tests.db.test_team_webhooks import SECRET, _deliver_all
from tests.launch_fixtures import make_fleet, make_job, make_node, make_user
from tests.webhook_receiver import Receiver
from tuneplane.app import webhook_targets
from tuneplane.app.db import Database
from tuneplane.app.security import new_token
from tuneplane.app.web import create_app

PUBLIC = "93.184.216.34"  # a public address the stub resolver hands out; nothing ever connects to it


@pytest.fixture(autouse=True)
def no_outside_connects(monkeypatch: pytest.MonkeyPatch) -> Iterator[list]:
    """Fails the test on any connect to a non-loopback address (and records it), so a refused target is
    proven never connected to; DNS is replaced by `names` (a name not in it does not resolve)."""
    attempted: list = []
    real_create = socket.create_connection

    def guarded(address, *args, **kwargs):
        if not ipaddress.ip_address(address[0]).is_loopback:
            attempted.append(address)
            raise AssertionError(f"connect to a non-loopback address {address}")
        return real_create(address, *args, **kwargs)

    names: dict[str, list[str]] = {}

    def stub_resolve(host: str, _port: int) -> list[str]:
        if host not in names:
            raise socket.gaierror(f"{host} not in the stub resolver")
        return list(names[host])

    monkeypatch.setattr(socket, "create_connection", guarded)
    monkeypatch.setattr(webhook_targets, "resolve", stub_resolve)
    monkeypatch.delenv(webhook_targets.ENV_ALLOW, raising=False)
    no_outside_connects.names = names  # type: ignore[attr-defined]
    yield attempted
    assert attempted == []


def _names() -> dict[str, list[str]]:
    return no_outside_connects.names  # type: ignore[attr-defined]


@pytest.fixture
def admin_client(db_url: str, db: Database, tmp_path: Path) -> FlaskClient:
    alice = make_user(db, "alice")
    client = create_app(db_url, config={"TP_DATA_DIR": str(tmp_path), "SECRET_KEY": "t"}).test_client()
    plaintext, digest = new_token("tpu")
    db.call("issue_scoped_api_token", alice, "t", digest, None, [], False)
    client.environ_base["HTTP_AUTHORIZATION"] = f"Bearer {plaintext}"
    client.environ_base["HTTP_ACCEPT"] = "application/json"
    return client


def _register(client: FlaskClient, url: str, **extra: object):
    return client.post("/teams/alice/webhooks", json={"url": url, "secret": SECRET, **extra})


@pytest.mark.parametrize(
    ("url", "said"),
    [
        ("https://169.254.169.254/latest/meta-data/", "link-local"),
        ("https://10.0.0.1:8443/", "private"),
        ("https://internal.example/hook", "resolves to a private address"),
        ("https://[fd00::1]/hook", "unique-local"),
        ("https://100.64.0.7/hook", "shared"),
        ("https://0.0.0.0/hook", "unspecified"),
        ("https://224.0.0.1/hook", "multicast"),
        ("https://[::ffff:10.0.0.1]/hook", "private"),
        ("http://127.0.0.1:8080/hook", "plain http"),
        ("https://127.0.0.1:8443/hook", "loopback"),
        ("https://user:pw@hooks.example/hook", "credentials"),
        ("https://hooks.example:99999/hook", "port"),
        ("https://hooks.example:0/hook", "port"),
        ("https://nowhere.example/hook", "does not resolve"),
    ],
)
def test_a_webhook_to_a_refused_target_is_refused_at_registration(
    admin_client: FlaskClient, db: Database, url: str, said: str
) -> None:
    _names().update({"internal.example": ["10.0.0.1"], "hooks.example": [PUBLIC]})
    refused = _register(admin_client, url)
    assert refused.status_code == 400 and refused.get_json()["fields"].keys() == {"url"}, refused.get_json()
    assert said in refused.get_json()["error"]
    assert db.fetch_one("SELECT count(*) AS n FROM team_webhooks")["n"] == 0


def test_a_public_target_registers_kinds_deduplicated_and_the_secret_is_not_echoed(
    admin_client: FlaskClient,
) -> None:
    _names()["hooks.example"] = [PUBLIC]
    made = _register(
        admin_client, "https://hooks.example/h", kinds=["job.failed", "job.failed", "job.running"]
    )
    assert made.status_code == 200, made.get_json()
    assert made.get_json()["kinds"] == ["job.failed", "job.running"] and "secret" not in made.get_json()
    generated = admin_client.post("/teams/alice/webhooks", json={"url": "https://hooks.example/g"})
    assert len(generated.get_json()["secret"]) >= 16  # a generated secret is shown this once
    page = admin_client.get("/teams/alice").get_json()
    assert all("secret" not in w for w in page["webhooks"])


@pytest.mark.parametrize(
    ("kinds", "field"),
    [
        ([], "kinds"),
        ("", "kinds"),
        (["job.nope"], "kinds"),
        (["job.failed"] * 2000, "kinds"),
        ([1], "kinds"),
    ],
)
def test_kinds_are_a_non_empty_list_of_known_kinds(
    admin_client: FlaskClient, db: Database, kinds: object, field: str
) -> None:
    _names()["hooks.example"] = [PUBLIC]
    refused = _register(admin_client, "https://hooks.example/h", kinds=kinds)
    assert refused.status_code == 400, refused.get_json()
    assert all(name.startswith(field) for name in refused.get_json()["fields"]), refused.get_json()
    assert db.fetch_one("SELECT count(*) AS n FROM team_webhooks")["n"] == 0


def _queued_event(db: Database, url: str) -> int:
    """A webhook stored as SQL allows (the registration check bypassed, as a DNS change after it would)
    and one event due for it."""
    fleet = make_fleet(db)
    make_node(db, fleet, "n0", gpus=4)
    alice = db.fetch_one("SELECT id FROM users WHERE username = 'alice'")
    owner = alice["id"] if alice else make_user(db, "alice")
    hook = db.call("create_team_webhook", owner, "alice", url, SECRET, ["job.reserved"])[0]["id"]
    make_job(db, owner, fleet)
    db.call("reserve_next", fleet, 10)
    return hook


def test_a_name_resolving_to_a_private_address_at_delivery_is_never_connected_to(
    db: Database, db_url: str, no_outside_connects: list
) -> None:
    """DNS rebinding: public when registered, 10.0.0.1 when the worker connects."""
    _names()["rebind.example"] = [PUBLIC]
    webhook_targets.check_target("https://rebind.example/h", webhook_targets.current_policy())
    _queued_event(db, "https://rebind.example/h")
    _names()["rebind.example"] = ["10.0.0.1"]
    _deliver_all(db_url)
    row = db.fetch_one("SELECT attempts, last_error, last_status, state FROM team_event_deliveries")
    assert (row["attempts"], row["last_error"], row["last_status"]) == (1, "refused by policy", None)
    assert no_outside_connects == []


def test_loopback_is_refused_at_delivery_without_the_allow_list_and_reached_with_it(
    db: Database, db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    receiver = Receiver()
    try:
        _queued_event(db, receiver.url)
        _deliver_all(db_url)
        assert receiver.got == []
        row = db.fetch_one("SELECT last_error FROM team_event_deliveries")
        assert row["last_error"] == "refused by policy"
        monkeypatch.setenv(webhook_targets.ENV_ALLOW, "127.0.0.1")
        db.fetch_all("UPDATE team_event_deliveries SET next_attempt_at = now() RETURNING 1")  # due again now
        _deliver_all(db_url)
        assert len(receiver.got) == 1
        assert db.fetch_one("SELECT state FROM team_event_deliveries")["state"] == "delivered"
    finally:
        receiver.close()


def test_a_failed_try_shows_a_coarse_class_never_the_exception_text(
    db: Database, db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(webhook_targets.ENV_ALLOW, "127.0.0.1")
    with socket.socket() as probe:  # a loopback port nobody listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    _queued_event(db, f"http://127.0.0.1:{port}/hook")
    _deliver_all(db_url)
    row = db.fetch_one("SELECT last_error FROM team_event_deliveries")
    assert row["last_error"] == "connection failed"
    tries = db.call("team_event_deliveries_of", db.fetch_one("SELECT id FROM users")["id"], "alice", 10)
    assert tries[0]["tries"][0]["error"] == "connection failed"
    # Whatever a worker reports, only a class is kept (a raw text would map the worker's network).
    delivery = db.fetch_one("SELECT id, attempts FROM team_event_deliveries")
    db.call("team_event_delivery_result", delivery["id"], delivery["attempts"] + 1, None,
            "ConnectionRefusedError: [Errno 111] Connection refused", 3)  # fmt: skip
    kept = db.fetch_all("SELECT error FROM team_event_attempts")
    assert {k["error"] for k in kept} == {"connection failed"}


ADDRESS_KINDS = [
    ("127.0.0.1", "loopback"), ("::1", "loopback"), ("10.1.2.3", "private"), ("172.16.0.1", "private"),
    ("192.168.1.1", "private"), ("169.254.169.254", "link-local"), ("fe80::1", "link-local"),
    ("fc00::1", "unique-local"), ("100.64.0.1", "shared (100.64/10)"), ("0.0.0.0", "unspecified"),
    ("::", "unspecified"), ("ff02::1", "multicast"), ("::ffff:192.168.0.1", "private"), (PUBLIC, None),
    ("2606:4700::1111", None),
]  # fmt: skip


def test_address_kinds() -> None:
    for text, kind in ADDRESS_KINDS:
        assert webhook_targets.refused_kind(ipaddress.ip_address(text)) == kind, text
    policy = webhook_targets.Policy.parse("127.0.0.1, 10.20.0.0/16,hooks.internal")
    assert policy.opens_host("127.0.0.1") and policy.opens_host("hooks.internal")
    assert policy.opens_address(ipaddress.ip_address("10.20.3.4"))
    assert not policy.opens_address(ipaddress.ip_address("10.21.0.1"))
    with pytest.raises(ValueError):
        webhook_targets.Policy.parse("bad/host")
