"""The web UI (``chat/server/routes/web.py``): ``web/`` served at ``/`` after every other route, and nothing mounted
where the folder has no ``index.html``."""

from __future__ import annotations

from fastapi import FastAPI
from fastapi.testclient import TestClient

from chat.server.routes import web
from tests.chat.server.routes.conftest import app_client


def test_the_web_ui_is_served_at_the_root_and_the_api_routes_still_answer():
    with app_client() as (_, client):
        page = client.get("/")
        assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
        assert page.text == (web.WEB_DIR / "index.html").read_text()
        assert client.get("/health").json()["status"] == "ok"  # mounted last: the routes before it win


def test_without_an_index_page_nothing_is_mounted(tmp_path, monkeypatch):
    monkeypatch.setattr(web, "WEB_DIR", tmp_path)
    app = FastAPI()
    web.register(app)
    assert not any(getattr(r, "name", None) == "web" for r in app.routes)
    assert TestClient(app).get("/").status_code == 404
    (tmp_path / "index.html").write_text("<p>hi</p>")
    web.register(app)
    assert TestClient(app).get("/").text == "<p>hi</p>"
