"""The Responses API with the official SDK: an agent loop through previous_response_id (each step sends only its new
input and the cache serves the rest), streamed events, responses owned by their tenant, and typed refusals."""

from __future__ import annotations

import httpx
import openai
import pytest

from tests.chat.engine.fakes import FakeRuntime
from tests.chat.server.conftest import make_server
from tests.chat.server.test_tenants import KEY_A, KEY_B, KEYS
from tests.chat.server.test_tools import TOOLS, agent_script

RESPONSE_TOOLS = [{"type": "function", **t["function"]} for t in TOOLS]


@pytest.fixture
def agent(tmp_path):
    keys = tmp_path / "keys"
    keys.write_text(KEYS)
    engine, srv = make_server(runtime=FakeRuntime(script=agent_script), api_keys_file=str(keys))
    with srv:
        yield srv, openai.OpenAI(base_url=f"{srv.url}/v1", api_key=KEY_A)
    engine.close()


def test_an_agent_loop_continues_by_previous_response_id_and_hits_the_cache(agent):
    _, client = agent
    first = client.responses.create(model="fake", input="Weather in Oslo?", tools=RESPONSE_TOOLS, max_output_tokens=200)
    (call,) = [o for o in first.output if o.type == "function_call"]
    assert first.status == "completed" and call.name == "get_weather" and call.arguments == '{"city":"Oslo"}'
    output = [{"type": "function_call_output", "call_id": call.call_id, "output": "sunny"}]
    second = client.responses.create(
        model="fake", previous_response_id=first.id, input=output, tools=RESPONSE_TOOLS, max_output_tokens=200
    )
    assert second.output_text == "It is sunny in Oslo." and second.previous_response_id == first.id
    usage = second.usage
    assert usage.input_tokens_details.cached_tokens / usage.input_tokens >= 0.95
    assert client.responses.retrieve(second.id).output_text == second.output_text


def test_a_streamed_response_sends_its_text_as_deltas_then_completes(agent):
    _, client = agent
    events = list(client.responses.create(model="fake", input="hello", max_output_tokens=12, stream=True))
    kinds = [e.type for e in events]
    assert kinds[:2] == ["response.created", "response.in_progress"] and kinds[-1] == "response.completed"
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text and text == events[-1].response.output_text
    assert [e.sequence_number for e in events] == list(range(len(events)))


def test_a_response_belongs_to_its_tenant(agent):
    srv, client = agent
    first = client.responses.create(model="fake", input="hello", max_output_tokens=4)
    other = openai.OpenAI(base_url=f"{srv.url}/v1", api_key=KEY_B)
    with pytest.raises(openai.NotFoundError) as refused:
        other.responses.create(model="fake", previous_response_id=first.id, input="and?", max_output_tokens=4)
    assert refused.value.body["code"] == "not_found"
    with pytest.raises(openai.NotFoundError):
        other.responses.retrieve(first.id)
    with pytest.raises(openai.NotFoundError):
        other.responses.delete(first.id)
    client.responses.delete(first.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(first.id)


def test_store_false_keeps_nothing(agent):
    _, client = agent
    reply = client.responses.create(model="fake", input="hello", max_output_tokens=4, store=False)
    with pytest.raises(openai.NotFoundError):
        client.responses.create(model="fake", previous_response_id=reply.id, input="and?", max_output_tokens=4)


@pytest.mark.parametrize(
    ("body", "code", "param"),
    [
        ({"input": "x", "background": True}, "unsupported_parameter", "background"),
        ({"input": "x", "include": ["reasoning.encrypted_content"]}, "unsupported_parameter", "include"),
        ({"input": "x", "reasoning": {"effort": "high"}}, "unsupported_parameter", "reasoning"),
        ({"input": "x", "reasoning": [1, 2.5]}, "invalid_request", "reasoning"),  # found by the OpenAPI fuzz test
        ({"input": "x", "reasoning": "high"}, "invalid_request", "reasoning"),
        ({"input": "x", "text": {"format": "json"}}, "invalid_request", "text.format"),
        ({"input": "x", "tools": [{"type": "web_search"}]}, "unsupported_parameter", "tools.0.type"),
        ({"input": [{"type": "item_reference", "id": "x"}]}, "unsupported_parameter", "input.0.type"),
        ({"input": "x", "previous_response_id": "resp_nope"}, "not_found", "previous_response_id"),
        ({"input": "x", "frobnicate": 1}, "unknown_parameter", "frobnicate"),
    ],
)
def test_bad_requests_are_refused_by_name(agent, body, code, param):
    srv, _ = agent
    r = httpx.post(f"{srv.url}/v1/responses", json=body, headers={"Authorization": f"Bearer {KEY_A}"}, timeout=30)
    error = r.json()["error"]
    assert r.status_code in (400, 404) and (error["code"], error["param"]) == (code, param), r.text
