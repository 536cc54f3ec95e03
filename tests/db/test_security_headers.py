"""Issue 15 point 5: clickjacking, CSP, nosniff and the Secure session cookie over HTTPS."""

from __future__ import annotations

import re

from tests.submission_setup import add_user
from tuneplane.app.db import Database
from tuneplane.app.web import create_app


def _client(db_url: str, **kwargs):
    return create_app(db_url, config={"SECRET_KEY": "test"}).test_client(**kwargs)


def test_every_answer_forbids_framing_and_sniffing_and_carries_the_csp(db_url: str) -> None:
    client = _client(db_url)
    answers = [
        client.get("/login"),
        client.get("/healthz"),
        client.get("/nope"),
        client.get("/plugins", headers={"Accept": "application/json"}),
        client.get("/static/console.js"),
    ]
    for response in answers:
        assert response.headers["X-Frame-Options"] == "DENY"
        assert response.headers["X-Content-Type-Options"] == "nosniff"
        csp = response.headers["Content-Security-Policy"]
        assert "frame-ancestors 'none'" in csp
        assert "script-src 'self'" in csp and "unsafe-inline" not in csp and "unsafe-eval" not in csp


def test_templates_have_no_inline_script_or_handler_the_csp_would_block(db_url: str) -> None:
    from tuneplane.app.resources import resource_dir

    for template in resource_dir("templates").rglob("*.html"):
        text = template.read_text()
        assert not re.search(r"<script(?![^>]*\bsrc=)", text), template
        assert not re.search(r"\son[a-z]+\s*=", text), template
        assert "hx-on" not in text and 'style="' not in text, template


def _login(client, name: str) -> object:
    page = client.get("/login").get_data(as_text=True)
    token = re.search(r'name="csrf_token" value="([^"]+)"', page).group(1)
    return client.post("/login", data={"username": name, "password": f"{name}-pw", "csrf_token": token})


def test_session_cookie_is_secure_over_https_only(db_url: str, db: Database) -> None:
    add_user(db, "alice", password="alice-pw")
    response = _login(_client(db_url), "alice")
    assert response.status_code == 303 and "Secure" not in response.headers["Set-Cookie"]
    secure_client = _client(db_url)
    page = secure_client.get("/login", base_url="https://localhost").get_data(as_text=True)
    token = re.search(r'name="csrf_token" value="([^"]+)"', page).group(1)
    response = secure_client.post(
        "/login",
        data={"username": "alice", "password": "alice-pw", "csrf_token": token},
        base_url="https://localhost",
    )
    assert response.status_code == 303
    cookie = response.headers["Set-Cookie"]
    assert "Secure" in cookie and "HttpOnly" in cookie and "SameSite=Lax" in cookie


def test_behind_a_trusted_tls_proxy_the_session_cookie_is_secure(db_url: str, tmp_path) -> None:
    import httpx

    from tests.e2e.server_processes import running_servers

    with running_servers(
        db_url, tmp_path / "data", names=("console",), console_args=("--trusted-proxy", "127.0.0.1")
    ) as servers:
        for proto, secure in (("https", True), ("http", False)):
            # The login form puts its CSRF token in the session: the answer sets the session cookie.
            answer = httpx.get(servers.console.url + "/login", headers={"X-Forwarded-Proto": proto})
            cookie = answer.headers["set-cookie"]
            assert cookie.startswith("session=") and ("Secure" in cookie) is secure, cookie
