from __future__ import annotations

from tuneplane.app.web import create_app


def test_healthz_is_200_when_database_answers(db_url: str) -> None:
    app = create_app(db_url)
    response = app.test_client().get("/healthz")
    assert response.status_code == 200 and response.get_json() == {"status": "ok"}  # alive, nothing more


def test_healthz_is_503_when_database_does_not_answer(tmp_path) -> None:
    app = create_app(
        f"host={tmp_path} port=1 dbname=none user=none connect_timeout=1", config={"SECRET_KEY": "test"}
    )
    response = app.test_client().get("/healthz")
    assert response.status_code == 503 and response.get_json() == {"status": "unavailable"}


def test_plugins_page_html_and_json(db_url: str) -> None:
    client = create_app(db_url).test_client()
    html = client.get("/plugins")
    assert html.status_code == 200 and b"Telemetry sources" in html.data and b"collector" in html.data
    data = client.get("/plugins", headers={"Accept": "application/json"}).get_json()
    assert any(p["name"] == "tensorboard" for p in data["plugins"]["telemetry_sources"])


def test_unknown_page_is_a_404_in_both_forms(db_url: str) -> None:
    client = create_app(db_url).test_client()
    assert client.get("/nope").status_code == 404
    response = client.get("/nope", headers={"Accept": "application/json"})
    assert response.status_code == 404 and "error" in response.get_json()
