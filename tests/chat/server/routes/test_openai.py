"""OpenAI's routes (``chat/server/routes/openai.py``), through the app: each surface checks the model and the server's
``--max-n``, answers whole or as a stream, and a stored response is read back and deleted by id (unknown ids:
``not_found`` naming the field). (The surfaces' bodies: tests/chat/server/surfaces/; their wire bytes:
test_wire_bodies.py; stored responses per tenant: test_responses.py.)"""

from __future__ import annotations

import pytest

from tests.chat.server.routes.conftest import app_client

USER = [{"role": "user", "content": "hi"}]
ROUTES = {
    "/v1/chat/completions": {"messages": USER, "max_tokens": 3},
    "/v1/completions": {"prompt": "hi", "max_tokens": 3},
    "/v1/responses": {"input": "hi", "max_output_tokens": 3},
}


@pytest.fixture(scope="module")
def client():
    with app_client(max_n=2) as (_, client):
        yield client


@pytest.mark.parametrize("path", sorted(ROUTES))
def test_each_route_answers_whole_or_streamed_and_refuses_an_unknown_model(client, path):
    whole = client.post(path, json=ROUTES[path])
    assert whole.status_code == 200 and whole.headers["content-type"] == "application/json"
    streamed = client.post(path, json={**ROUTES[path], "stream": True})
    assert streamed.status_code == 200 and streamed.headers["content-type"].startswith("text/event-stream")
    assert streamed.text.startswith(("data: ", "event: "))
    unknown = client.post(path, json={**ROUTES[path], "model": "gpt-9"})
    assert unknown.status_code == 404 and unknown.json()["error"]["param"] == "model"


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
def test_more_replies_than_the_servers_max_n_are_refused_naming_n(client, path):
    assert client.post(path, json={**ROUTES[path], "n": 2}).status_code == 200
    r = client.post(path, json={**ROUTES[path], "n": 3})
    assert r.status_code == 400 and r.json()["error"]["param"] == "n"


def test_a_stored_response_is_read_back_then_deleted_and_then_not_found(client):
    body = client.post("/v1/responses", json=ROUTES["/v1/responses"]).json()
    assert client.get(f"/v1/responses/{body['id']}").json() == body
    deleted = client.delete(f"/v1/responses/{body['id']}")
    assert deleted.status_code == 200 and deleted.json()["deleted"] is True and deleted.json()["id"] == body["id"]
    for method in (client.get, client.delete):
        r = method(f"/v1/responses/{body['id']}")
        assert r.status_code == 404 and r.json()["error"]["param"] == "response_id"
    r = client.post("/v1/responses", json={**ROUTES["/v1/responses"], "previous_response_id": body["id"]})
    assert r.status_code == 404 and r.json()["error"]["param"] == "previous_response_id"
