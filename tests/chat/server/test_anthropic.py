"""Anthropic's Messages API (``/v1/messages``, ``/v1/messages/count_tokens``) with the official ``anthropic`` SDK:
create, stream, a tool loop, count_tokens, errors in Anthropic's shape, usage as Anthropic counts it, breakpoints
carried to the engine's turn, thinking, context_management, and the request shapes Claude Code sends."""

from __future__ import annotations

import json

import anthropic
import httpx
import pytest

from chat.engine.reasoning import Markers
from chat.server.surfaces import anthropic_api, anthropic_convert, anthropic_types
from tests.chat.engine.fakes import FakeRuntime
from tests.chat.server.conftest import make_server

CALL = '{"tool_calls":[{"name":"get_weather","arguments":{"city":"Oslo"}}]}'
SCHEMA = {
    "type": "object",
    "properties": {"city": {"type": "string"}},
    "required": ["city"],
    "additionalProperties": False,
}
TOOLS = [{"name": "get_weather", "description": "Weather in a city", "input_schema": SCHEMA}]
USER = [{"role": "user", "content": "Say hello."}]


def _text(prompt) -> str:
    return bytes(t for t in prompt if t < 256).decode(errors="ignore")


def script(prompt) -> str:
    """A fake model: calls get_weather when asked about weather (until it sees a result), stops mid-way on a
    STOPTEST prompt, else says hello."""
    text = _text(prompt)
    if "sunny" in text:
        return '{"response":"It is sunny in Oslo."}'
    if "weather" in text.lower():
        return CALL
    if "STOPTEST" in text:
        return "alpha beta END gamma"
    return "Hello there."


class ThinkingFake(FakeRuntime):
    reasoning = Markers()

    def render_prompt(self, messages, template_kwargs=None):  # a template that ignores its variables
        return super().render_prompt(messages)


def thinking_script(prompt) -> str:
    text = _text(prompt)
    if "sunny" in text:
        return '<think>\nDone.\n</think>\n\n{"response":"Sunny."}'
    if "weather" in text.lower():
        return "<think>\nI should call the tool.\n</think>\n\n" + CALL
    return "<think>\nTwo and two.\n</think>\n\nFour."


@pytest.fixture(scope="module")
def fake():
    engine, srv = make_server(runtime=FakeRuntime(script=script))
    with srv:
        yield srv, anthropic.Anthropic(base_url=srv.url, api_key="unused", max_retries=0)
    engine.close()


@pytest.fixture(scope="module")
def thinker():
    engine, srv = make_server(runtime=ThinkingFake(script=thinking_script))
    with srv:
        yield srv, anthropic.Anthropic(base_url=srv.url, api_key="unused", max_retries=0)
    engine.close()


def _events(response: httpx.Response) -> list[dict]:
    out = []
    for block in response.text.split("\n\n"):
        lines = dict(line.split(": ", 1) for line in block.splitlines() if ": " in line)
        if "data" in lines:
            data = json.loads(lines["data"])
            assert lines["event"] == data["type"]
            out.append(data)
    return out


def test_create_returns_a_message_whose_usage_says_what_the_cache_served(fake):
    _, client = fake
    first = client.messages.create(model="fake", max_tokens=50, messages=USER)
    assert first.type == "message" and first.role == "assistant" and first.model == "fake"
    assert [b.type for b in first.content] == ["text"] and first.content[0].text == "Hello there."
    assert first.stop_reason == "end_turn" and first.stop_sequence is None
    u = first.usage
    assert u.cache_read_input_tokens == 0 and u.cache_creation_input_tokens == 0 and u.output_tokens > 0
    assert u.turncache["cache_miss_reason"] == "cold" and u.turncache["max_tokens"] == 50
    second = client.messages.create(model="fake", max_tokens=50, messages=USER)
    total = second.usage.input_tokens + second.usage.cache_read_input_tokens
    assert total == u.input_tokens and second.usage.cache_read_input_tokens == total - 1  # all but the last token


def test_a_stream_sends_anthropics_events_in_order_and_the_sdk_assembles_the_same_message(fake):
    srv, client = fake
    body = {"model": "fake", "max_tokens": 50, "messages": USER, "stream": True}
    r = httpx.post(f"{srv.url}/v1/messages", json=body, timeout=30)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    events = _events(r)
    kinds = [e["type"] for e in events]
    assert kinds[:2] == ["message_start", "content_block_start"] and kinds[-3:] == [
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    assert set(kinds[2:-3]) == {"content_block_delta"}
    assert events[0]["message"]["content"] == [] and events[0]["message"]["stop_reason"] is None
    assert "".join(e["delta"]["text"] for e in events if e["type"] == "content_block_delta") == "Hello there."
    delta = events[-2]
    assert delta["delta"] == {"stop_reason": "end_turn"} and delta["usage"]["output_tokens"] > 0
    with client.messages.stream(model="fake", max_tokens=50, messages=USER) as stream:
        final = stream.get_final_message()
    assert final.content[0].text == "Hello there." and final.stop_reason == "end_turn"


def test_a_tool_loop_calls_then_answers_and_the_second_step_reads_the_first_from_the_cache(fake):
    _, client = fake
    messages: list = [{"role": "user", "content": "What is the weather in Oslo?"}]
    first = client.messages.create(model="fake", max_tokens=200, tools=TOOLS, messages=messages)
    assert first.stop_reason == "tool_use" and [b.type for b in first.content] == ["tool_use"]
    use = first.content[0]
    assert use.name == "get_weather" and use.input == {"city": "Oslo"} and use.id.startswith("toolu_")
    messages += [
        {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in first.content]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "sunny, 20 C"}]},
    ]
    second = client.messages.create(model="fake", max_tokens=200, tools=TOOLS, messages=messages)
    assert second.stop_reason == "end_turn" and second.content[0].text == "It is sunny in Oslo."
    # the history up to the result is read from the cache, the call too (settled as the next step renders it): the
    # reuse stops where the cache ends, not where the history differs from it (a call re-serialized otherwise would)
    prompt_before = first.usage.input_tokens + first.usage.cache_read_input_tokens
    assert second.usage.cache_read_input_tokens > prompt_before
    assert second.usage.turncache["cache_miss_reason"] == "end_of_cache"


def test_a_streamed_tool_call_is_a_tool_use_block_with_its_input_as_json(fake):
    srv, client = fake
    body = {
        "model": "fake",
        "max_tokens": 200,
        "tools": TOOLS,
        "tool_choice": {"type": "any", "disable_parallel_tool_use": True},
        "messages": [{"role": "user", "content": "weather?"}],
        "stream": True,
    }
    events = _events(httpx.post(f"{srv.url}/v1/messages", json=body, timeout=30))
    start = next(e for e in events if e["type"] == "content_block_start")
    assert start["content_block"]["type"] == "tool_use" and start["content_block"]["input"] == {}
    partial = [e["delta"] for e in events if e["type"] == "content_block_delta"]
    assert partial[0]["type"] == "input_json_delta" and json.loads(partial[0]["partial_json"]) == {"city": "Oslo"}
    assert events[-2]["delta"]["stop_reason"] == "tool_use"
    with client.messages.stream(model="fake", max_tokens=200, tools=TOOLS, messages=body["messages"]) as stream:
        final = stream.get_final_message()
    assert final.content[0].type == "tool_use" and final.content[0].input == {"city": "Oslo"}


def test_tool_choice_none_and_a_named_tool_that_does_not_exist(fake):
    _, client = fake
    plain = client.messages.create(
        model="fake", max_tokens=50, tools=TOOLS, tool_choice={"type": "none"}, messages=USER
    )
    assert plain.stop_reason == "end_turn" and plain.content[0].type == "text"
    with pytest.raises(anthropic.BadRequestError) as caught:
        client.messages.create(
            model="fake", max_tokens=50, tools=TOOLS, tool_choice={"type": "tool", "name": "nope"}, messages=USER
        )
    assert "tool_choice" in caught.value.body["error"]["message"]


def test_a_stop_sequence_ends_the_reply_and_is_named(fake):
    _, client = fake
    reply = client.messages.create(
        model="fake",
        max_tokens=50,
        stop_sequences=["END", "never"],
        messages=[{"role": "user", "content": "STOPTEST"}],
        metadata={"user_id": "u-1"},
        extra_body={"temperature": 0.5, "top_p": 0.9, "top_k": 40},  # older SDKs' fields; 2.14 sends none
    )
    assert reply.stop_reason == "stop_sequence" and reply.stop_sequence == "END"
    assert reply.content[0].text == "alpha beta "


def test_max_tokens_past_the_context_is_capped_and_said_in_usage():
    engine, srv = make_server(runtime=FakeRuntime(script=script, context_window=256))
    with srv:
        client = anthropic.Anthropic(base_url=srv.url, api_key="unused", max_retries=0)
        reply = client.messages.create(model="fake", max_tokens=32000, messages=USER, timeout=30)
    engine.close()
    prompt = reply.usage.input_tokens + reply.usage.cache_read_input_tokens + reply.usage.cache_creation_input_tokens
    assert reply.usage.turncache["max_tokens"] == 256 - prompt


def test_count_tokens_counts_the_prompt_a_create_renders(fake):
    _, client = fake
    system = [{"type": "text", "text": "Be brief."}, {"type": "text", "text": "Be kind."}]
    counted = client.messages.count_tokens(model="fake", system=system, tools=TOOLS, messages=USER)
    reply = client.messages.create(model="fake", max_tokens=20, system=system, tools=TOOLS, messages=USER)
    u = reply.usage
    assert counted.input_tokens == u.input_tokens + u.cache_read_input_tokens + u.cache_creation_input_tokens


def test_errors_come_in_anthropics_shape_with_its_statuses(fake):
    srv, client = fake
    with pytest.raises(anthropic.BadRequestError) as caught:
        client.messages.create(model="fake", max_tokens=10, messages=USER, extra_body={"bogus": 1})
    assert caught.value.body == {
        "type": "error",
        "error": {"type": "invalid_request_error", "message": caught.value.body["error"]["message"]},
    }
    assert "bogus" in caught.value.body["error"]["message"]
    nested = [{"role": "user", "content": [{"type": "text", "text": "hi", "colour": "red"}]}]
    with pytest.raises(anthropic.BadRequestError) as caught:
        client.messages.create(model="fake", max_tokens=10, messages=nested)
    assert "colour" in caught.value.body["error"]["message"]
    with pytest.raises(anthropic.BadRequestError) as caught:
        client.messages.create(model="fake", max_tokens=10, messages=USER, extra_body={"container": "c-1"})
    assert "container" in caught.value.body["error"]["message"]
    with pytest.raises(anthropic.NotFoundError) as caught:
        client.messages.create(model="claude-nope", max_tokens=10, messages=USER)
    assert caught.value.body["error"]["type"] == "not_found_error"
    marked = [{"type": "text", "text": f"b{i}", "cache_control": {"type": "ephemeral"}} for i in range(5)]
    with pytest.raises(anthropic.BadRequestError) as caught:
        client.messages.create(model="fake", max_tokens=10, messages=[{"role": "user", "content": marked}])
    assert "at most 4" in caught.value.body["error"]["message"]
    edits = {"edits": [{"type": "clear_tool_uses_20250919"}]}
    with pytest.raises(anthropic.BadRequestError) as caught:
        client.messages.create(model="fake", max_tokens=10, messages=USER, extra_body={"context_management": edits})
    assert "clear_tool_uses_20250919" in caught.value.body["error"]["message"]
    r = httpx.post(f"{srv.url}/v1/messages", json={"model": "fake", "messages": USER}, timeout=10)  # no max_tokens
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"
    assert "max_tokens" in r.json()["error"]["message"]


def test_keys_are_read_from_x_api_key_or_a_bearer_header():
    engine, srv = make_server(runtime=FakeRuntime(script=script), auth_token="sekret")
    with srv:
        for key in ("sekret", None):
            client = anthropic.Anthropic(base_url=srv.url, api_key=key or "wrong", max_retries=0)
            if key:
                assert client.messages.create(model="fake", max_tokens=5, messages=USER).type == "message"
            else:
                with pytest.raises(anthropic.AuthenticationError) as caught:
                    client.messages.create(model="fake", max_tokens=5, messages=USER)
                assert caught.value.body["error"]["type"] == "authentication_error"
        bearer = anthropic.Anthropic(base_url=srv.url, auth_token="sekret", max_retries=0)
        assert bearer.messages.count_tokens(model="fake", messages=USER).input_tokens > 0
    engine.close()


def test_a_breakpoint_is_carried_on_the_turn_in_tokens_and_counts_as_cache_creation(fake):
    """The system's first block is marked: its tokens (role marker + text) are the breakpoint; a cold request
    writes them (cache_creation_input_tokens), the same request again reads them."""
    _, client = fake
    system = [
        {"type": "text", "text": "Rules one. ", "cache_control": {"type": "ephemeral", "ttl": "1h"}},
        {"type": "text", "text": "Rules two."},
    ]
    body = anthropic_types.MessagesRequest.model_validate(
        {"model": "fake", "max_tokens": 5, "system": system, "messages": USER}
    )
    runtime = FakeRuntime()
    converted = anthropic_convert.to_chat(body, runtime)
    (turn,) = anthropic_convert.prepare(converted, "", runtime).turns
    (mark,) = anthropic_convert.breakpoint_tokens(converted, turn, "", runtime)
    assert mark.tokens == 1 + len("Rules one. ") and mark.ttl_s == 3600 and mark.where == "system.0"
    first = client.messages.create(model="fake", max_tokens=5, system=system, messages=USER)
    created = mark.tokens - first.usage.cache_read_input_tokens  # the system's role marker may be cached already
    assert created > 10 and first.usage.cache_creation_input_tokens == created
    assert first.usage.cache_creation.ephemeral_1h_input_tokens == created
    again = client.messages.create(model="fake", max_tokens=5, system=system, messages=USER)
    assert again.usage.cache_creation_input_tokens == 0 and again.usage.cache_read_input_tokens > mark.tokens


def test_thinking_comes_as_a_thinking_block_whole_and_streamed(thinker):
    srv, client = thinker
    thinking = {"type": "enabled", "budget_tokens": 64}
    reply = client.messages.create(model="fake", max_tokens=200, thinking=thinking, messages=USER)
    assert [b.type for b in reply.content] == ["thinking", "text"]
    assert reply.content[0].thinking == "Two and two." and reply.content[0].signature
    assert reply.content[1].text == "Four." and reply.usage.turncache["thinking"] == "template"
    body = {"model": "fake", "max_tokens": 200, "thinking": thinking, "messages": USER, "stream": True}
    events = _events(httpx.post(f"{srv.url}/v1/messages", json=body, timeout=30))
    starts = [e["content_block"]["type"] for e in events if e["type"] == "content_block_start"]
    deltas = [e["delta"]["type"] for e in events if e["type"] == "content_block_delta"]
    assert starts == ["thinking", "text"] and "thinking_delta" in deltas and "signature_delta" in deltas
    assert deltas.index("signature_delta") < deltas.index("text_delta")


def test_thinking_on_a_model_that_does_not_think_is_accepted_and_reported(fake):
    _, client = fake
    reply = client.messages.create(
        model="fake", max_tokens=200, thinking={"type": "enabled", "budget_tokens": 100}, messages=USER
    )
    assert reply.content[0].text == "Hello there." and reply.usage.turncache["thinking"] == "unsupported"


def test_clear_thinking_keeps_the_last_turns_thinking_in_the_prompt(thinker):
    """With keep N, only the last N assistant turns' thinking reaches the template (this fake renders it)."""
    _, client = thinker
    turn = lambda thought, text: {  # noqa: E731
        "role": "assistant",
        "content": [{"type": "thinking", "thinking": thought, "signature": "s"}, {"type": "text", "text": text}],
    }
    history = [*USER, turn("First thoughts.", "One."), {"role": "user", "content": "Again."}]
    history += [turn("Second.", "Two."), {"role": "user", "content": "More."}]

    def count(keep) -> int:
        edits = {"edits": [{"type": "clear_thinking_20251015", "keep": keep}]}
        return client.beta.messages.count_tokens(
            model="fake", messages=history, context_management=edits, betas=["context-management-2025-06-27"]
        ).input_tokens

    all_kept, last_kept = count("all"), count({"type": "thinking_turns", "value": 1})
    assert all_kept - last_kept == len("<think>First thoughts.</think>")


def test_a_claude_code_shaped_session_streams_and_its_second_step_reads_the_prefix_from_the_cache(thinker):
    """What Claude Code sends (?beta=true, anthropic-beta, x-api-key, system as 3 blocks with cache_control on the
    last two, 24 tools, thinking with a 31999-token budget and max_tokens 32000, context_management,
    metadata.user_id, a first message of 4 text blocks whose last is marked); the next step moves the marker to
    the tool_result."""
    srv, _ = thinker
    tools = [
        {
            "name": f"Tool{i}",
            "description": f"Tool number {i}.",
            "input_schema": {"type": "object", "properties": {"arg": {"type": "string"}}, "required": ["arg"]},
        }
        for i in range(23)
    ] + TOOLS
    cc = {"type": "ephemeral"}
    system = [
        {"type": "text", "text": "x-anthropic-billing-header: cc_version=2.1.197.c8e; cc_entrypoint=sdk-cli;"},
        {"type": "text", "text": "You are Claude Code.", "cache_control": cc},
        {"type": "text", "text": "Follow the rules. " * 20, "cache_control": cc},
    ]
    first_message = [{"type": "text", "text": f"<system-reminder>r{i}</system-reminder>"} for i in range(3)]
    first_message.append({"type": "text", "text": "What is the weather in Oslo?", "cache_control": cc})
    body = {
        "model": "fake",
        "max_tokens": 32000,
        "thinking": {"type": "enabled", "budget_tokens": 31999},
        "context_management": {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]},
        "metadata": {"user_id": "user_abc_account_def_session_123"},
        "system": system,
        "tools": tools,
        "messages": [{"role": "user", "content": first_message}],
        "stream": True,
    }
    headers = {
        "x-api-key": "unused",
        "anthropic-version": "2023-06-01",
        "anthropic-beta": "claude-code-20250219,interleaved-thinking-2025-05-14",
    }
    r = httpx.post(f"{srv.url}/v1/messages?beta=true", json=body, headers=headers, timeout=60)
    assert r.status_code == 200, r.text
    events = _events(r)
    blocks = [e["content_block"] for e in events if e["type"] == "content_block_start"]
    assert [b["type"] for b in blocks] == ["thinking", "tool_use"] and blocks[1]["name"] == "get_weather"
    final = events[-2]
    assert final["delta"]["stop_reason"] == "tool_use"
    assert final["usage"]["cache_creation_input_tokens"] > 0 and final["usage"]["turncache"]["thinking"] == "template"
    deltas = [e["delta"] for e in events if e["type"] == "content_block_delta"]
    thought = "".join(d.get("thinking", "") for d in deltas)
    signature = next(d["signature"] for d in deltas if d["type"] == "signature_delta")
    call = json.loads(next(d["partial_json"] for d in deltas if d["type"] == "input_json_delta"))
    first_message[-1] = {k: v for k, v in first_message[-1].items() if k != "cache_control"}
    body["messages"] = [
        {"role": "user", "content": first_message},
        {
            "role": "assistant",
            "content": [
                {"type": "thinking", "thinking": thought, "signature": signature},
                {"type": "tool_use", "id": blocks[1]["id"], "name": "get_weather", "input": call},
            ],
        },
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": blocks[1]["id"], "content": "sunny", "cache_control": cc}
            ],
        },
    ]
    second = _events(httpx.post(f"{srv.url}/v1/messages?beta=true", json=body, headers=headers, timeout=60))
    usage = second[-2]["usage"]
    prompt = usage["input_tokens"] + usage["cache_read_input_tokens"] + usage["cache_creation_input_tokens"]
    assert second[-2]["delta"]["stop_reason"] == "end_turn"
    assert usage["cache_read_input_tokens"] >= final["usage"]["cache_creation_input_tokens"]
    assert usage["cache_read_input_tokens"] / prompt > 0.8


def test_a_ping_goes_out_while_a_long_prefill_runs(monkeypatch):
    monkeypatch.setattr(anthropic_api, "KEEPALIVE_S", 0.05)
    from cache import PrefixCache
    from chat.engine.engine import Engine
    from chat.engine.scheduler import BatchSettings
    from chat.server.app import create_app
    from chat.server.runner import BackgroundServer
    from chat.server.settings import ServerSettings

    runtime = FakeRuntime(script=script, delay_s=0.2)
    engine = Engine(runtime, cache=PrefixCache(), batch=BatchSettings(token_budget=16))  # 16-token prefill chunks
    srv = BackgroundServer(create_app(engine, ServerSettings(), model_name="fake"))
    with srv:
        long = [{"role": "user", "content": "Say hello. " * 12}]  # ~9 chunks of prefill
        body = {"model": "fake", "max_tokens": 5, "messages": long, "stream": True}
        events = _events(httpx.post(f"{srv.url}/v1/messages", json=body, timeout=30))
    engine.close()
    kinds = [e["type"] for e in events]
    # message_start waits for the prompt's usage (the first prefill chunk): the pings of that wait come before it;
    # then pings go on while the rest of the prompt is computed, until the first block
    assert kinds[0] == "ping" and kinds[-1] == "message_stop"
    start, first_block = kinds.index("message_start"), kinds.index("content_block_start")
    assert set(kinds[:start]) == {"ping"} and set(kinds[start + 1 : first_block]) == {"ping"}
    assert first_block > start + 1
    assert events[start]["message"]["usage"]["input_tokens"] > 0


def test_message_start_carries_the_prompts_usage_as_the_end_reports_it(fake):
    """Anthropic's clients read input and cache usage from message_start: it says what message_delta says of the
    prompt (read from the cache, written up to the breakpoint, the rest), before the first token."""
    srv, _ = fake
    system = [{"type": "text", "text": "You are terse. " * 20, "cache_control": {"type": "ephemeral"}}]
    messages = [{"role": "user", "content": "Say hello to message_start."}]
    body = {"model": "fake", "max_tokens": 20, "system": system, "messages": messages, "stream": True}
    keys = ("input_tokens", "cache_read_input_tokens", "cache_creation_input_tokens", "cache_creation")
    seen = []
    for _ in range(2):  # cold (written up to the breakpoint), then read from the cache
        events = _events(httpx.post(f"{srv.url}/v1/messages", json=body, timeout=30))
        start = events[0]["message"]["usage"]
        end = events[-2]["usage"]
        assert events[0]["type"] == "message_start" and events[-2]["type"] == "message_delta"
        assert {k: start[k] for k in keys} == {k: end[k] for k in keys}
        assert start["output_tokens"] == 0 and end["output_tokens"] > 0
        assert start["turncache"].get("cache_miss_reason") == end["turncache"].get("cache_miss_reason")
        seen.append(start)
    first, second = seen  # the first may read a template header other tests stored
    assert first["cache_creation_input_tokens"] > 100 and second["cache_creation_input_tokens"] == 0
    assert second["cache_read_input_tokens"] >= first["cache_read_input_tokens"] + first["cache_creation_input_tokens"]


def _png() -> str:
    import base64
    import io

    from PIL import Image

    buffer = io.BytesIO()
    Image.new("RGB", (8, 8), (200, 30, 30)).save(buffer, format="PNG")
    return base64.b64encode(buffer.getvalue()).decode()


def test_an_image_block_reaches_the_model_and_one_it_cannot_take_is_refused_naming_it(fake):
    from tests.chat.engine.fakes import FakeMediaRuntime

    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": _png()}}
    content = [image, {"type": "text", "text": "What is this?"}]
    engine, srv = make_server(runtime=FakeMediaRuntime(script=script))
    with srv:
        client = anthropic.Anthropic(base_url=srv.url, api_key="unused", max_retries=0)
        with_image = client.messages.count_tokens(model="fake", messages=[{"role": "user", "content": content}])
        without = client.messages.count_tokens(model="fake", messages=[{"role": "user", "content": content[1:]}])
        reply = client.messages.create(model="fake", max_tokens=50, messages=[{"role": "user", "content": content}])
    engine.close()
    assert with_image.input_tokens == without.input_tokens + FakeMediaRuntime.MEDIA_TOKENS + len("\n\n")
    assert reply.content[0].text == "Hello there."
    _, text_only = fake
    with pytest.raises(anthropic.BadRequestError) as caught:
        text_only.messages.create(model="fake", max_tokens=10, messages=[{"role": "user", "content": content}])
    assert "messages[0].content[0]" in caught.value.body["error"]["message"]


def test_an_error_result_is_marked_for_the_model(fake):
    _, client = fake
    use = {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Oslo"}}

    def count(is_error: bool) -> int:
        result = {"type": "tool_result", "tool_use_id": "toolu_1", "content": "no such city", "is_error": is_error}
        messages = [
            {"role": "user", "content": "weather?"},
            {"role": "assistant", "content": [use]},
            {"role": "user", "content": [result]},
        ]
        return client.messages.count_tokens(model="fake", tools=TOOLS, messages=messages).input_tokens

    assert count(True) - count(False) == len("Error: ")


def test_a_tenant_over_its_rate_is_refused_with_429_rate_limit_error():
    engine, srv = make_server(runtime=FakeRuntime(script=script), tenant_requests_per_minute=1)
    with srv:
        client = anthropic.Anthropic(base_url=srv.url, api_key="unused", max_retries=0)
        client.messages.create(model="fake", max_tokens=5, messages=USER)
        with pytest.raises(anthropic.RateLimitError) as caught:
            client.messages.create(model="fake", max_tokens=5, messages=USER)
    engine.close()
    assert caught.value.body["error"]["type"] == "rate_limit_error" and caught.value.response.headers["retry-after"]


def test_served_model_aliases_let_claude_codes_model_names_through_and_nothing_else():
    """``--served-model-alias``: Claude Code's main and small/fast model names reach the model served through a
    glob; an exact alias works on every route; any other name stays a 404; an alias that accepts every name is
    refused at start."""
    from pydantic import ValidationError

    from chat.server.settings import ServerSettings

    engine, srv = make_server(runtime=FakeRuntime(script=script), served_model_aliases=["claude-*", "gpt-4o"])
    with srv:
        client = anthropic.Anthropic(base_url=srv.url, api_key="unused", max_retries=0)
        for name in ("claude-sonnet-4-5-20250929", "claude-haiku-4-5-20251001"):
            reply = client.messages.create(model=name, max_tokens=5, messages=USER)
            assert reply.model == name and reply.content[0].text  # the name asked for, as Anthropic echoes it
            assert client.messages.count_tokens(model=name, messages=USER).input_tokens > 0
        chat = {"model": "gpt-4o", "messages": USER, "max_tokens": 3}
        r = httpx.post(f"{srv.url}/v1/chat/completions", json=chat, timeout=30)
        assert r.status_code == 200 and r.json()["model"] == "fake"
        for name in ("claude", "Claude-3", "gpt-4o-mini", "other"):
            with pytest.raises(anthropic.NotFoundError):
                client.messages.create(model=name, max_tokens=5, messages=USER)
        r = httpx.post(f"{srv.url}/v1/chat/completions", json={**chat, "model": "gpt-4"}, timeout=30)
        assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"
    engine.close()
    for everything in ("*", "**", "?*", " claude-*"):
        with pytest.raises(ValidationError):
            ServerSettings(served_model_aliases=[everything])


def test_claude_codes_mid_conversation_system_message_and_effort_are_taken(fake):
    """Claude Code 2.1.197 sends a ``system`` message inside ``messages`` (its mid-conversation-system beta) and
    ``output_config: {"effort": "high"}`` on its first request: the system message renders where it stands (a
    breakpoint on it counts), effort is accepted and said not applied; anything but text in such a message is
    refused naming the field. Its tools' descriptions run to 18,780 characters."""
    _, client = fake
    note = "Available agent types for the Agent tool: none."
    messages = [
        {"role": "user", "content": [{"type": "text", "text": "say hi", "cache_control": {"type": "ephemeral"}}]},
        {"role": "system", "content": note},
    ]
    effort = {"output_config": {"effort": "high"}}
    body = {"model": "fake", "max_tokens": 10, "messages": messages, "extra_body": effort}
    reply = client.messages.create(**body)
    assert reply.usage.turncache["effort"] == "not_applied"
    without = client.messages.count_tokens(model="fake", messages=messages[:1])
    counted = client.messages.count_tokens(model="fake", messages=messages)
    assert counted.input_tokens > without.input_tokens + len(note) // 2  # the system message is in the prompt
    blocks = [{"role": "system", "content": [{"type": "text", "text": note, "cache_control": {"type": "ephemeral"}}]}]
    marked = client.messages.create(model="fake", max_tokens=10, messages=[*messages[:1], *blocks])
    assert marked.usage.cache_creation_input_tokens + marked.usage.cache_read_input_tokens >= counted.input_tokens - 8
    image = [{"role": "system", "content": [{"type": "image", "source": {"type": "url", "url": "data:,"}}]}]
    with pytest.raises(anthropic.BadRequestError) as caught:
        client.messages.create(model="fake", max_tokens=10, messages=[*messages[:1], *image])
    assert "messages.1.content.0" in caught.value.body["error"]["message"]
    with pytest.raises(anthropic.BadRequestError) as caught:
        client.messages.create(**{**body, "extra_body": {"output_config": {"format": {"type": "json_schema"}}}})
    assert "output_config.format.schema" in caught.value.body["error"]["message"]  # a format without its schema
    workflow = [{**TOOLS[0], "description": "w" * 18_780}]  # its Workflow tool's description is this long
    assert client.messages.count_tokens(model="fake", tools=workflow, messages=USER).input_tokens > 18_780


def test_output_config_format_constrains_the_reply_to_its_schema(fake):
    """Claude Code asks for a session title with ``output_config.format`` (a JSON schema, no tools): the reply's
    text matches the schema (constrained decoding, as OpenAI's response_format json_schema)."""
    _, client = fake
    schema = {
        "type": "object",
        "properties": {"title": {"type": "string"}},
        "required": ["title"],
        "additionalProperties": False,
    }
    config = {"output_config": {"format": {"type": "json_schema", "schema": schema}, "effort": "high"}}
    reply = client.messages.create(model="fake", max_tokens=60, messages=USER, extra_body=config)
    text = reply.content[0].text  # the fake's text forced into the schema (it may run to max_tokens inside the string)
    assert reply.content[0].type == "text" and text.replace(" ", "").startswith('{"title":"')
    free = client.messages.create(model="fake", max_tokens=60, messages=USER)
    assert free.content[0].text == "Hello there."  # what the fake writes unconstrained
