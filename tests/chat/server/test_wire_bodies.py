"""The bytes each OpenAI surface writes, pinned: a representative whole and streamed body of chat completions
(text, log-probabilities, tool calls, thinking, n=2), legacy completions (echo with log-probabilities, two prompts)
and responses (text, a function call, a held reply cut short, thinking, ``max_output_tokens`` reached, the echoed
request fields, a failure and a slow client mid-stream, a stored response continued, read back and deleted), compared
with files under ``data/wire`` (ids, times and timings' figures normalized). The typed wire models must write exactly
these bytes. ``TURNCACHE_UPDATE_WIRE=1`` rewrites the files (then read the diff)."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import httpx
import pytest

from chat.engine.reasoning import Markers
from tests.chat.engine.fakes import FakeRuntime
from tests.chat.server.conftest import make_server

DATA = Path(__file__).parent / "data" / "wire"
CALL = '{"tool_calls":[{"name":"get_weather","arguments":{"city":"Oslo"}}]}'
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
        },
    }
]
IDS = re.compile(r"\b(chatcmpl-|cmpl-|resp_|msg_|rs_|fc_|call_)[0-9a-f]{16,32}\b")
TIMES = re.compile(r'("created(?:_at)?": ?)\d+')
POISON = "~"  # a byte no other reply or prompt here holds
TIMINGS = re.compile(r'"timings": ?\{[^}]*\}')


def _text(prompt) -> str:
    return bytes(t for t in prompt if t < 256).decode(errors="ignore")


def script(prompt) -> str:
    text = _text(prompt)
    if "weather" in text.lower():
        return CALL
    if "fail" in text:
        return "ab" + POISON + "cd"  # the feed of POISON fails: the reply fails after two deltas
    if "think" in text:
        return "<think>\nTwo and two.\n</think>\n\nFour, caf\u00e9."
    return "Hello there, caf\u00e9 \u2603."


class ThinkingFake(FakeRuntime):
    reasoning = Markers()

    def render_prompt(self, messages, template_kwargs=None):
        return super().render_prompt(messages)


@pytest.fixture(scope="module")
def urls():
    # no prefix cache: usage is the same whichever tests ran before
    runtime = FakeRuntime(script=script)
    runtime.poison = ord(POISON)
    engine, srv = make_server(prefix_cache=False, runtime=runtime)
    thinker, tsrv = make_server(prefix_cache=False, runtime=ThinkingFake(script=script))
    with srv, tsrv:
        yield srv.url, tsrv.url
    engine.close()
    thinker.close()


def normalized(body: str) -> str:
    seen: dict[str, str] = {}

    def ident(match: re.Match) -> str:
        return seen.setdefault(match.group(0), f"{match.group(1)}ID{len(seen) + 1}")

    body = IDS.sub(ident, body)
    body = TIMES.sub(lambda m: m.group(1) + "0", body)
    return TIMINGS.sub(lambda m: re.sub(r"\d+(\.\d+)?", "N", m.group(0)), body)


def pinned(name: str, body: str) -> None:
    path = DATA / f"{name}.txt"
    got = normalized(body)
    if os.environ.get("TURNCACHE_UPDATE_WIRE"):
        path.write_text(got)
    assert got == path.read_text()


USER = [{"role": "user", "content": "hi"}]
CASES = {
    "chat_text": ("/v1/chat/completions", {"messages": USER, "max_tokens": 20}),
    "chat_logprobs": ("/v1/chat/completions", {"messages": USER, "max_tokens": 4, "logprobs": True, "top_logprobs": 2}),
    "chat_tools": (
        "/v1/chat/completions",
        {"messages": [{"role": "user", "content": "weather in Oslo?"}], "tools": TOOLS, "max_tokens": 80},
    ),
    "chat_n2": ("/v1/chat/completions", {"messages": USER, "max_tokens": 3, "n": 2}),
    "completions_echo": (
        "/v1/completions",
        {"prompt": ["hi", "yo"], "max_tokens": 3, "echo": True, "logprobs": 1},
    ),
    "completions_text": ("/v1/completions", {"prompt": "hi", "max_tokens": 30}),
    "responses_text": ("/v1/responses", {"input": "hi", "max_output_tokens": 30, "store": False}),
    "responses_length": ("/v1/responses", {"input": "hi", "max_output_tokens": 5, "store": False}),
    "responses_echoed_fields": (
        "/v1/responses",
        {
            "input": [
                {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]},
                {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": "{}"},
                {"type": "function_call_output", "call_id": "call_1", "output": "sunny"},
            ],
            "instructions": "Be brief.",
            "temperature": 0.5,
            "top_p": 0.9,
            "metadata": {"k": "v\u00e9"},
            "parallel_tool_calls": False,
            "text": {"format": {"type": "text"}},
            "tool_choice": "none",
            "max_output_tokens": 30,
            "store": False,
        },
    ),
    "responses_tools_cut_short": (
        "/v1/responses",
        {
            "input": "hi",
            "tools": [{"type": "function", **TOOLS[0]["function"]}],
            "max_output_tokens": 30,
            "store": False,
        },
    ),
    "responses_tools": (
        "/v1/responses",
        {
            "input": "weather in Oslo?",
            "tools": [{"type": "function", **TOOLS[0]["function"]}],
            "max_output_tokens": 80,
            "store": False,
        },
    ),
}


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_each_surface_writes_the_bytes_it_wrote_before(urls, case, stream):
    path, body = CASES[case]
    r = httpx.post(f"{urls[0]}{path}", json={**body, "model": "fake", "stream": stream}, timeout=30)
    assert r.status_code == 200
    pinned(f"{case}_{'stream' if stream else 'whole'}", r.text)


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_a_thinking_reply_writes_the_bytes_it_wrote_before(urls, stream):
    messages = [{"role": "user", "content": "think"}]
    body = {"model": "fake", "messages": messages, "max_tokens": 60, "stream": stream}
    r = httpx.post(f"{urls[1]}/v1/chat/completions", json=body, timeout=30)
    assert r.status_code == 200
    pinned(f"chat_thinking_{'stream' if stream else 'whole'}", r.text)


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_a_responses_reply_that_thought_writes_the_bytes_it_wrote_before(urls, stream):
    body = {"model": "fake", "input": "think", "max_output_tokens": 60, "store": False, "stream": stream}
    r = httpx.post(f"{urls[1]}/v1/responses", json=body, timeout=30)
    assert r.status_code == 200
    pinned(f"responses_reasoning_{'stream' if stream else 'whole'}", r.text)


def test_a_responses_stream_that_fails_while_generating_writes_the_bytes_it_wrote_before(urls):
    body = {"model": "fake", "input": "fail", "max_output_tokens": 30, "store": False, "stream": True}
    r = httpx.post(f"{urls[0]}/v1/responses", json=body, timeout=30)
    assert r.status_code == 200 and '"type": "error"' in r.text
    pinned("responses_failed_stream", r.text)


def test_a_stored_response_continued_read_back_and_deleted_writes_the_bytes_it_wrote_before(urls):
    first = httpx.post(f"{urls[0]}/v1/responses", json={"model": "fake", "input": "hi", "max_output_tokens": 5})
    assert first.status_code == 200
    body = {"model": "fake", "input": "yo", "max_output_tokens": 8, "previous_response_id": first.json()["id"]}
    second = httpx.post(f"{urls[0]}/v1/responses", json=body, timeout=30)
    assert second.status_code == 200
    rid = second.json()["id"]
    got = httpx.get(f"{urls[0]}/v1/responses/{rid}", timeout=30)
    deleted = httpx.delete(f"{urls[0]}/v1/responses/{rid}", timeout=30)
    assert (got.status_code, deleted.status_code) == (200, 200)
    pinned("responses_stored", "\n".join([first.text, second.text, got.text, deleted.text]))


def test_a_responses_stream_cut_for_a_slow_client_writes_the_bytes_it_wrote_before():
    import asyncio

    from chat.server.errors import SlowClientError
    from chat.server.reply.reader import Failed, TextOut
    from chat.server.surfaces import responses_api

    async def replies():
        yield [(0, TextOut("caf\u00e9"))]
        yield [(0, Failed(SlowClientError("the client read too slowly: 10 events unread")))]

    async def read() -> str:
        req = responses_api.ResponsesRequest(input="hi", stream=True, store=False)
        return "".join([e async for e in responses_api._sse(replies(), False, req, "m", None, "tenant", [])])

    pinned("responses_slow_client_stream", asyncio.run(read()))


def _events(sse: str) -> list[dict]:
    return [json.loads(line[6:]) for line in sse.splitlines() if line.startswith("data: ")]


@pytest.mark.parametrize("thinking", [False, True], ids=["text", "thought"])
def test_a_responses_stream_places_every_event_at_its_item_in_the_final_output(urls, thinking):
    """Every ``output_index`` a stream names is where its item stands in ``response.completed``'s output (clients
    such as openai-python's stream accumulator build the output by it). A reply that thought has its reasoning item
    at 0, announced before the message's deltas, which are at 1 (they said 0 while the reasoning took 0 at the end)."""
    body = {"model": "fake", "input": "think" if thinking else "hi", "max_output_tokens": 60, "store": False}
    r = httpx.post(f"{urls[1] if thinking else urls[0]}/v1/responses", json={**body, "stream": True}, timeout=30)
    events = _events(r.text)
    ids = [item["id"] for item in events[-1]["response"]["output"]]
    assert ids and (ids[0].startswith("rs_") if thinking else ids[0].startswith("msg_"))
    added = []
    for e in events:
        if "output_index" not in e:
            continue
        named = e["item"]["id"] if "item" in e else e["item_id"]
        assert ids[e["output_index"]] == named, e
        if e["type"] == "response.output_item.added":
            added.append(named)
    assert added == ids  # announced in output order, each once
