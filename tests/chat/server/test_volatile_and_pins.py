"""Over HTTP: two agent sessions whose system prompts differ only in Claude Code's billing line share their prefix
(the line is dropped from the rendered prompt), what the server stores keeps the line, ``--keep-volatile-lines``
names the miss; /metrics shows pins, server-wide and per tenant."""

from __future__ import annotations

import httpx

from cache import Namespace, PrefixCache
from chat.engine.engine import Engine
from chat.engine.volatile_lines import VolatileLines
from chat.server.app import create_app
from chat.server.settings import ServerSettings
from chat.server.tenancy.auth import cache_salt
from tests.chat.engine.fakes import FakeRuntime
from tests.chat.server.conftest import BackgroundServer
from tests.chat.server.routes.test_ops import KEY_OPS, series
from tests.chat.server.test_tenants import KEY_A, KEY_B

SYSTEM = "You are an agent. Read the files before editing them. " * 6


def billing(suffix: str) -> str:
    return f"x-anthropic-billing-header: cc_version=2.1.197.{suffix}; cc_entrypoint=sdk-cli;"


def start(volatile: VolatileLines | None, **settings):
    engine = Engine(FakeRuntime(), cache=PrefixCache(), volatile=volatile)
    app = create_app(engine, ServerSettings(**settings), model_name="fake")
    return engine, app, BackgroundServer(app)


def chat(url: str, suffix: str, question: str = "what does main.py do?") -> dict:
    body = {
        "messages": [
            {"role": "system", "content": billing(suffix) + "\n" + SYSTEM},
            {"role": "user", "content": question},
        ],
        "max_tokens": 3,
    }
    response = httpx.post(url + "/v1/chat/completions", json=body, timeout=30)
    assert response.status_code == 200, response.text
    return response.json()["usage"]


def test_sessions_with_different_billing_lines_share_the_prefix_and_the_store_keeps_the_line():
    engine, app, srv = start(VolatileLines())
    with srv:
        first = chat(srv.url, "c8e")
        second = chat(srv.url, "3a7")
        assert first["prompt_tokens_details"]["cached_tokens"] == 0
        assert second["prompt_tokens_details"]["cached_tokens"] == second["prompt_tokens"] - 1
        system = {"role": "system", "content": billing("c8e") + "\n" + SYSTEM}
        body = {"input": [system, {"role": "user", "content": "hello"}], "max_output_tokens": 3}
        response = httpx.post(srv.url + "/v1/responses", json=body, timeout=30)
        assert response.status_code == 200, response.text
        stored = app.state.responses.get(response.json()["id"], "default").messages
        assert any(billing("c8e") in str(m.get("content")) for m in stored)  # stored as the client sent it
    engine.close()


def test_with_the_lines_kept_the_second_session_misses_at_the_line():
    engine, _, srv = start(VolatileLines(drop=False))
    with srv:
        chat(srv.url, "c8e")
        details = chat(srv.url, "3a7")["prompt_tokens_details"]
        assert details["cache_miss_reason"] == "volatile_line"
        assert details["cached_tokens"] == details["cache_miss_at"] == 1 + billing("c8e").index("c8e")
    engine.close()


def test_metrics_show_pins_server_wide_and_per_tenant(tmp_path):
    path = tmp_path / "keys"
    path.write_text(f"{KEY_A} alice\n{KEY_B} bob\n{KEY_OPS} ops admin\n")
    engine, _, srv = start(None, api_keys_file=str(path))
    with srv:
        headers = {"authorization": f"Bearer {KEY_A}"}
        body = {"messages": [{"role": "user", "content": "remember this"}], "max_tokens": 3}
        assert httpx.post(srv.url + "/v1/chat/completions", json=body, headers=headers, timeout=30).status_code == 200
        runtime = engine.runtime
        prompt = runtime.render(body["messages"])
        alice = Namespace(runtime.fingerprint, runtime.dtype, cache_salt("alice"))
        with engine._lock:  # the worker is idle; the cache is its to touch otherwise
            assert engine.cache.pin(alice, prompt, len(prompt), 300).pinned
            assert not engine.cache.pin(alice, [*prompt[:-1], 9], len(prompt), 300).pinned  # never cached
        admin = series(httpx.get(srv.url + "/metrics", headers={"authorization": f"Bearer {KEY_OPS}"}).text)
        assert admin["turncache_cache_pins"] == 1 and admin["turncache_cache_pinned_entries"] == 1
        assert admin["turncache_cache_pinned_bytes"] > 0
        assert admin['turncache_cache_pins_total{outcome="refused"}'] == 1
        assert admin['turncache_tenant_pins{tenant="alice"}'] == 1
        assert admin['turncache_tenant_pins_refused_total{tenant="alice"}'] == 1
        assert admin['turncache_tenant_pins{tenant="bob"}'] == 0
        own = series(httpx.get(srv.url + "/metrics", headers={"authorization": f"Bearer {KEY_B}"}).text)
        assert own['turncache_tenant_pins{tenant="bob"}'] == 0 and "alice" not in str(own)
    engine.close()


def messages_body(suffix: str, question: str) -> dict:
    cc = {"type": "ephemeral"}
    return {
        "model": "fake",
        "max_tokens": 3,
        "system": [
            {"type": "text", "text": billing(suffix)},
            {"type": "text", "text": "You are Claude Code.", "cache_control": cc},
            {"type": "text", "text": SYSTEM, "cache_control": cc},
        ],
        "messages": [{"role": "user", "content": [{"type": "text", "text": question, "cache_control": cc}]}],
    }


def test_claude_code_sessions_share_the_system_prefix_and_their_breakpoints_are_pinned_and_reported():
    engine, _, srv = start(VolatileLines())
    with srv:

        def send(suffix: str, question: str) -> dict:
            r = httpx.post(srv.url + "/v1/messages?beta=true", json=messages_body(suffix, question), timeout=30)
            assert r.status_code == 200, r.text
            return r.json()["usage"]

        first = send("c8e", "list the files")
        marks = first["turncache"]["breakpoints"]
        assert [m["where"] for m in marks] == ["system.1", "system.2", "messages.0.content.0"]
        assert all(m["pinned"] for m in marks) and marks[1]["tokens"] < marks[2]["tokens"]
        assert marks[0]["tokens"] == 1 + len("\nYou are Claude Code.")  # measured without the billing line
        counted = {k: v for k, v in messages_body("c8e", "list the files").items() if k != "max_tokens"}
        count = httpx.post(srv.url + "/v1/messages/count_tokens", json=counted, timeout=30)
        assert count.status_code == 200, count.text
        prompt = first["input_tokens"] + first["cache_read_input_tokens"] + first["cache_creation_input_tokens"]
        assert count.json()["input_tokens"] == prompt  # counted as the engine renders it: without the line
        second = send("3a7", "now read main.py")  # another session: another billing line, another question
        assert second["turncache"]["breakpoints"][1]["tokens"] == marks[1]["tokens"]  # the same system prefix
        assert second["cache_read_input_tokens"] >= marks[1]["tokens"]
        stats = engine.cache.stats()
        assert stats.pins_renewed >= 2  # the system breakpoints: the first session's pins, renewed
        assert stats.pins == 4  # two on the system, one per session's last message
    engine.close()
