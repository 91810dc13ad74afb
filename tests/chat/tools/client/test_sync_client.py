"""ChatClient: the blocking wrapper, its loop thread, and cancel from inside on_delta."""

from __future__ import annotations

import threading

import pytest

from chat.tools.client import ChatClient, ConnectFailed, ConnectionLost, InvalidRequestError
from tests.chat.tools.client.helpers import drop_on_turn, fake_server, free_port, scripted_server


def test_blocking_session_with_streaming_callback():
    with fake_server() as (_, url), ChatClient(url) as client:
        client.create_session(system="s")
        deltas: list[str] = []
        first = client.send("hello", on_delta=deltas.append)
        second = client.send("again")
        stateless = client.complete([{"role": "user", "content": "x"}])
        regen = client.regenerate()
        edited = client.edit("changed", index=0)
        conv = client.conversation()
        client.ping()
        assert "".join(deltas) == first.text
        assert second.cached_tokens > first.cached_tokens and stateless.message_id is None
        assert regen.cached_tokens == regen.prompt_tokens - 1
        assert [m.content for m in conv.messages] == ["changed", edited.text]
        assert client.session is not None and client.session.id == conv.session_id
        with pytest.raises(InvalidRequestError):
            client.edit("y", index=9)


def test_cancel_from_on_delta_and_from_another_thread():
    with fake_server() as (engine, url), ChatClient(url) as client:
        engine.runtime.script = lambda p: "word " * 300
        engine.runtime.delay_s = 0.003
        client.create_session()
        reply = client.send("long", on_delta=lambda d: client.cancel())
        assert reply.finish_reason == "cancelled"
        timer = threading.Timer(0.2, client.cancel)
        timer.start()
        reply = client.send("long again")
        timer.join()
        assert reply.finish_reason == "cancelled"


def test_connect_failure_and_lost_connection_are_typed_and_leave_no_thread():
    before = threading.active_count()
    with pytest.raises(ConnectFailed):
        ChatClient(f"ws://127.0.0.1:{free_port()}/v1/ws", open_timeout=5)
    assert threading.active_count() == before
    with scripted_server(drop_on_turn) as (url, _):
        client = ChatClient(url)
        client.create_session()
        with pytest.raises(ConnectionLost):
            client.send("hi")
        client.close()
        client.close()  # twice is fine
        with pytest.raises(RuntimeError, match="closed"):
            client.ping()


def test_tools_and_tool_results_round_trip_through_the_blocking_client():
    from tests.chat.server.test_tools import TOOLS, agent_script

    with fake_server() as (engine, url), ChatClient(url) as client:
        engine.runtime.script = agent_script
        client.create_session()
        deltas: list[str] = []
        called = client.send("What is the weather in Oslo?", tools=TOOLS, on_delta=deltas.append)
        assert called.finish_reason == "tool_calls" and called.text == "" and deltas == []
        (call,) = called.tool_calls
        assert call.function.name == "get_weather" and call.function.arguments == '{"city":"Oslo"}'
        answer = client.send_tool_results({call.id: "sunny"}, tools=TOOLS)
        assert answer.text == "It is sunny in Oslo." and answer.tool_calls == ()
        assert answer.cached_tokens == called.prompt_tokens + called.completion_tokens - 1
        roles = [m.role for m in client.conversation().messages]
        assert roles == ["user", "assistant", "tool", "assistant"]
        with pytest.raises(InvalidRequestError, match=r"results\.0\.tool_call_id"):
            client.send_tool_results({"call_unknown": "x"})


def test_a_stateless_tool_loop_through_the_blocking_client():
    from tests.chat.server.test_tools import TOOLS, agent_script

    with fake_server() as (engine, url), ChatClient(url) as client:
        engine.runtime.script = agent_script
        messages = [{"role": "user", "content": "What is the weather in Oslo?"}]
        called = client.complete(messages, tools=TOOLS)
        assert called.finish_reason == "tool_calls" and called.text == ""
        (call,) = called.tool_calls
        assert call.function.name == "get_weather"
        messages += [
            {"role": "assistant", "content": "", "tool_calls": called.tool_calls},
            {"role": "tool", "tool_call_id": call.id, "content": "sunny"},
        ]
        answer = client.complete(messages, tools=TOOLS)
        assert answer.text == "It is sunny in Oslo." and answer.finish_reason == "stop"
        assert answer.cached_tokens == called.prompt_tokens + called.completion_tokens - 1
        with pytest.raises(InvalidRequestError, match=r"messages\.1\.tool_call_id"):
            client.complete([messages[0], {"role": "tool", "tool_call_id": "call_unknown", "content": "x"}])
