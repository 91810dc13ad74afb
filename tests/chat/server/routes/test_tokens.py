"""``POST /tokenize`` and ``POST /detokenize`` (``chat/server/routes/tokens.py``), through the app: the runtime's
tokens of a prompt or of messages as the template renders them, and the model checked first."""

from __future__ import annotations

import pytest

from tests.chat.engine.fakes import FakeRuntime
from tests.chat.server.routes.conftest import app_client

USER = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def client():
    with app_client() as (_, client):
        yield client


@pytest.mark.parametrize(("path", "body"), [("/tokenize", {"prompt": "abc"}), ("/detokenize", {"tokens": [104]})])
def test_an_unknown_model_is_refused_on_both_routes(client, path, body):
    r = client.post(path, json={**body, "model": "gpt-9"})
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"
    assert client.post(path, json={**body, "model": "fake"}).status_code == 200  # its own name is fine


def test_tokenize_and_detokenize(client):
    tokens = client.post("/tokenize", json={"prompt": "abc"}).json()
    assert tokens["tokens"] == [97, 98, 99] and tokens["count"] == 3
    chat = client.post("/tokenize", json={"messages": USER}).json()
    assert chat["tokens"] == FakeRuntime().render(USER)
    assert client.post("/detokenize", json={"tokens": [104, 105]}).json() == {"prompt": "hi"}
