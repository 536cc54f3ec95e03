"""Two real agents against a real gateway: connectivity from heartbeat age, kill -9, restart without a
token, refusals as the agent prints them, the credential file's place and mode, and TLS for real."""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
import shutil
import signal
import stat
import time
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from tests.e2e.node_processes import start_agent, start_gateway, start_worker
from tests.helpers import wait_for
from tests.node_helpers import enroll, events, fast_thresholds, make_fleet, make_token
from tuneplane.app.db import Database
from tuneplane.app.security import token_hash
from tuneplane.workers.agent.credential import FileCredentialStore, StoredCredential
from tuneplane.workers.agent.directories import AgentPaths

pytestmark = pytest.mark.e2e

HEARTBEAT, STALE, LOST = 0.3, 1.5, 3.0


def _node(db: Database, name: str) -> dict | None:
    return db.fetch_one("SELECT * FROM v_nodes WHERE node = %s", (name,))


def test_two_agents_connect_and_a_killed_one_goes_stale_then_lost_and_returns_without_a_token(
    db_url: str, db: Database, port: int, tmp_path: Path
) -> None:
    fast_thresholds(db, heartbeat=HEARTBEAT, stale=STALE, lost=LOST)
    make_fleet(db)
    gateway = start_gateway(db_url, port)
    worker = start_worker(db_url, tmp_path / "data")  # its sweep writes the connectivity events
    url = f"http://127.0.0.1:{port}"
    agents = {}
    try:
        for name, gpus in (("alpha", "2"), ("beta", "1")):
            agents[name] = start_agent(
                url, tmp_path / name / "state", "--name", name, "--simulate-gpus", gpus, token=make_token(db)
            )
        for name in agents:
            agents[name].wait_line(f"connected to {url} as node gpu/{name}")

        def both_connected_with_capacity() -> bool:
            rows = [_node(db, n) for n in agents]
            return all(
                r
                and r["connectivity"] == "connected"
                and r["cpus"] > 0
                and r["memory_bytes"] > 0
                and r["gpus"] >= 1
                for r in rows
            )

        wait_for(both_connected_with_capacity, timeout=20, what="both agents connected with capacity")
        alpha, beta = _node(db, "alpha"), _node(db, "beta")
        assert (alpha["gpus"], alpha["simulated_gpus"], beta["gpus"]) == (2, 2, 1)
        assert alpha["agent_version"] and "simulated" in alpha["gpu_models"]

        # The credential: 0600, in the private state dir, not under the directory workloads get.
        for name in agents:
            paths = AgentPaths.prepare(tmp_path / name / "state")
            info = os.stat(paths.credential_path)
            assert stat.S_IMODE(info.st_mode) == 0o600
            assert stat.S_IMODE(os.stat(paths.state_dir).st_mode) == 0o700
            assert not paths.credential_path.is_relative_to(paths.work_dir)
            assert paths.workload_dir("job-1", "rank-0").is_relative_to(paths.work_dir)

        db.call("drain_node", "gpu/beta", "e2e: scheduling must survive a crash", "user:test")
        beta_id = beta["node_id"]
        agents["beta"].process.send_signal(signal.SIGKILL)
        agents["beta"].process.wait(10)
        killed = time.monotonic()
        wait_for(lambda: _node(db, "beta")["connectivity"] == "stale", timeout=STALE + 3, interval=0.05)
        to_stale = time.monotonic() - killed
        wait_for(lambda: _node(db, "beta")["connectivity"] == "lost", timeout=LOST + 3, interval=0.05)
        to_lost = time.monotonic() - killed
        # Within the configured thresholds (plus one flush of batched heartbeats and polling slack).
        assert to_stale <= STALE + 1.5 and to_lost <= LOST + 1.5 and to_lost > to_stale
        assert _node(db, "beta")["scheduling_state"] == "draining"
        assert _node(db, "alpha")["connectivity"] == "connected"
        wait_for(
            lambda: (
                [e["reason"] for e in events(db, "connectivity") if e["node"] == "beta"][-2:]
                == ["connected -> stale", "stale -> lost"]
            ),
            timeout=5,
            what="connectivity events",
        )

        used_tokens = db.fetch_one("SELECT count(*) AS n FROM enrollment_tokens WHERE used_at IS NOT NULL")[
            "n"
        ]
        agents["beta"] = start_agent(url, tmp_path / "beta" / "state", "--simulate-gpus", "1")
        agents["beta"].wait_line(f"connected to {url} as node gpu/beta (id {beta_id},")
        wait_for(lambda: _node(db, "beta")["connectivity"] == "connected", timeout=10)
        assert _node(db, "beta")["node_id"] == beta_id and _node(db, "beta")["scheduling_state"] == "draining"
        assert db.fetch_one("SELECT count(*) AS n FROM nodes")["n"] == 2
        assert (
            db.fetch_one("SELECT count(*) AS n FROM enrollment_tokens WHERE used_at IS NOT NULL")["n"]
            == used_tokens
        )
    finally:
        for agent in agents.values():
            agent.stop()
        worker.stop()
        gateway.stop()


def test_refusals_are_clear_errors_with_events(db_url: str, db: Database, port: int, tmp_path: Path) -> None:
    fast_thresholds(db, heartbeat=0.3, stale=2, lost=4, rotate=0.5, grace=1.0)
    make_fleet(db)
    gateway = start_gateway(db_url, port)
    url = f"http://127.0.0.1:{port}"
    try:
        # A reused enrollment token.
        token = make_token(db)
        first = start_agent(url, tmp_path / "a" / "state", "--name", "a", token=token)
        first.wait_line("connected to")
        reused = start_agent(url, tmp_path / "b" / "state", "--name", "b", token=token)
        assert reused.exit_code() == 1
        assert "Error: enrollment refused: enrollment token was already used" in reused.out.text()
        first.stop()

        # An expired one.
        expired = make_token(db, ttl=dt.timedelta(milliseconds=1))
        late = start_agent(url, tmp_path / "c" / "state", "--name", "c", token=expired)
        assert late.exit_code() == 1 and "enrollment token expired at" in late.out.text()

        # A wrong credential.
        wrong_dir = AgentPaths.prepare(tmp_path / "d" / "state")
        FileCredentialStore(wrong_dir.credential_path).save(StoredCredential(1, "a", "gpu", "tpn_made_up"))
        wrong = start_agent(url, wrong_dir.state_dir)
        assert wrong.exit_code() == 1 and "unknown node credential" in wrong.out.text()

        # A credential rotated out past its grace period: the agent gets a new one over the socket; a copy of
        # the old one is refused once the grace period is over.
        node, old_credential = enroll(db, make_token(db), "e")
        rotating = AgentPaths.prepare(tmp_path / "e" / "state")
        store = FileCredentialStore(rotating.credential_path)
        store.save(StoredCredential(node["node_id"], "e", "gpu", old_credential))
        holder = start_agent(url, rotating.state_dir)
        holder.wait_line("credential rotated")
        assert store.load().credential != old_credential

        def old_is_refused() -> bool:
            try:
                db.call("authenticate_node_credential", token_hash(old_credential))
            except Exception:
                return True
            return False

        wait_for(old_is_refused, timeout=10, what="the old credential's grace period to end")
        stale_dir = AgentPaths.prepare(tmp_path / "f" / "state")
        FileCredentialStore(stale_dir.credential_path).save(
            StoredCredential(node["node_id"], "e", "gpu", old_credential)
        )
        replay = start_agent(url, stale_dir.state_dir)
        assert replay.exit_code() == 1
        assert "rotated out" in replay.out.text() and "grace period ended" in replay.out.text()
        holder.stop()
    finally:
        gateway.stop()
    reasons = [(e["node"], e["fleet"], e["reason"]) for e in events(db, "refused")]
    assert any("already used" in r and f == "gpu" for _n, f, r in reasons)
    assert any("expired" in r and f == "gpu" for _n, f, r in reasons)
    assert any("unknown node credential" in r and n is None for n, _f, r in reasons)
    assert any("rotated out" in r and n == "e" for n, _f, r in reasons)


def test_state_dir_inside_the_work_dir_is_refused(tmp_path: Path, port: int) -> None:
    work = tmp_path / "work"
    agent = start_agent(f"http://127.0.0.1:{port}", work / "state", "--work-dir", str(work), token="tpe_x")
    assert agent.exit_code() == 1 and "must never be under a directory given to workloads" in agent.out.text()


def test_plain_http_to_a_remote_gateway_is_refused(tmp_path: Path) -> None:
    agent = start_agent("http://192.0.2.10:8081", tmp_path / "state", token="tpe_x")
    assert agent.exit_code() == 1 and "refusing plain HTTP to 192.0.2.10" in agent.out.text()


def _test_pki(directory: Path) -> tuple[Path, Path, Path]:
    """(CA bundle, server certificate, server key) for 127.0.0.1 and localhost, made here."""
    now = dt.datetime.now(dt.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "TunePlane test CA")])
    ca_cert = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                key_cert_sign=True,
                crl_sign=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "node gateway")]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
            ),
            critical=False,
        )
        .add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    ca_path, cert_path, key_path = directory / "ca.pem", directory / "server.pem", directory / "server.key"
    ca_path.write_bytes(ca_cert.public_bytes(serialization.Encoding.PEM))
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    return ca_path, cert_path, key_path


def test_agent_dials_an_https_gateway_only_with_the_private_ca(
    db_url: str, db: Database, port: int, tmp_path: Path
) -> None:
    ca, cert, key = _test_pki(tmp_path)
    make_fleet(db)
    token = make_token(db)
    gateway = start_gateway(db_url, port, "--tls-cert", str(cert), "--tls-key", str(key))
    url = f"https://127.0.0.1:{port}"
    try:
        refused = start_agent(url, tmp_path / "no-ca" / "state", "--name", "tls", token=token)
        assert refused.exit_code() == 1
        text = refused.out.text()
        assert "TLS verification of https://127.0.0.1" in text and "CERTIFICATE_VERIFY_FAILED" in text
        # Nothing reached the database: the token is still unused.
        assert db.fetch_one("SELECT used_at FROM enrollment_tokens")["used_at"] is None

        trusted = start_agent(
            url, tmp_path / "ca" / "state", "--name", "tls", "--ca-bundle", str(ca), token=token
        )
        trusted.wait_line(f"connected to {url} as node gpu/tls")
        wait_for(lambda: (_node(db, "tls") or {}).get("connectivity") == "connected", timeout=10)
        trusted.stop()
        shutil.rmtree(tmp_path / "no-ca", ignore_errors=True)
    finally:
        gateway.stop()
