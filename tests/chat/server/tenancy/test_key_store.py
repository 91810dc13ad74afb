"""Keys without restarts: a reload (SIGHUP, a changed file) puts new keys in force at once, closes the live sockets of a
removed key with a typed reason, leaves everyone else alone, and keeps the old keys when the new file is malformed."""

from __future__ import annotations

import asyncio
import logging
import os
import signal

import httpx
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from chat.engine.engine import Engine
from chat.server.app import create_app
from chat.server.settings import ServerSettings
from tests.chat.engine.fakes import FakeRuntime
from tests.chat.server.conftest import make_server
from tests.chat.server.surfaces.test_ws import Client, ws_url
from tests.chat.server.test_tenants import KEY_A, KEY_A2, KEY_B, as_

KEY_C = "carol-key-0123456789abcdefgh"
BODY = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}


def status(srv, key: str) -> int:
    headers = {"authorization": f"Bearer {key}"}
    return httpx.post(f"{srv.url}/v1/chat/completions", json=BODY, headers=headers, timeout=30).status_code


def test_a_removed_key_stops_at_once_and_a_new_key_and_new_limits_apply(tmp_path):
    path = tmp_path / "keys"
    path.write_text(f"{KEY_A} alice\n{KEY_A2} alice\n{KEY_B} bob\n")
    engine, srv = make_server(api_keys_file=str(path))
    with srv:
        assert status(srv, KEY_A) == 200 and status(srv, KEY_C) == 401
        path.write_text(f"{KEY_A2} alice\n{KEY_B} bob\n{KEY_C} carol\ntenant bob requests_per_minute=1\n")
        assert srv.app.state.keys.reload()
        assert status(srv, KEY_A) == 401  # removed: refused by the very next request
        assert status(srv, KEY_A2) == 200 and status(srv, KEY_C) == 200
        assert status(srv, KEY_B) == 200 and status(srv, KEY_B) == 429  # bob's new limit
    engine.close()


def test_a_malformed_file_at_reload_keeps_the_keys_in_force_and_logs_why(tmp_path, caplog):
    path = tmp_path / "keys"
    path.write_text(f"{KEY_A} alice\n")
    engine, srv = make_server(api_keys_file=str(path))
    with srv:
        for broken in (f"{KEY_B} bob\ntenant bob rpm=3\n", "", f"{KEY_B}\n"):
            path.write_text(broken)
            with caplog.at_level(logging.ERROR, logger="turncache.keys"):
                assert not srv.app.state.keys.reload()
            assert status(srv, KEY_A) == 200 and status(srv, KEY_B) == 401
        logged = "\n".join(r.getMessage() for r in caplog.records if r.name == "turncache.keys")
        assert "unknown field 'rpm'" in logged and "holds no key" in logged and "entry 1" in logged
        assert str(path) in logged and KEY_B not in logged
    engine.close()


def test_live_sockets_of_a_removed_key_are_closed_with_key_revoked_and_the_others_go_on(tmp_path):
    path = tmp_path / "keys"
    path.write_text(f"{KEY_A} alice\n{KEY_A2} alice\n{KEY_B} bob\n")
    engine, srv = make_server(api_keys_file=str(path))
    engine.runtime.script = lambda prompt: "word " * 200
    engine.runtime.delay_s = 0.005
    with srv:

        async def scenario() -> tuple[dict, int, str, dict]:
            async with (
                connect(ws_url(srv), **as_(KEY_A)) as alice,
                connect(ws_url(srv), **as_(KEY_A2)) as rotated,
                connect(ws_url(srv), **as_(KEY_B)) as bob,
            ):
                a = Client(alice)
                await a.start_streaming("a long answer")  # a turn is running on the socket to be closed
                await asyncio.to_thread(path.write_text, f"{KEY_A2} alice\n{KEY_B} bob\n")
                assert await asyncio.to_thread(srv.app.state.keys.reload)
                while (event := await a.recv())["type"] != "error":
                    assert event["type"] == "reply.delta"
                try:
                    await asyncio.wait_for(alice.recv(), 10)
                    raise AssertionError("the socket stayed open")
                except ConnectionClosed as exc:
                    code, reason = exc.rcvd.code, exc.rcvd.reason
                still = Client(rotated)  # alice's other key, and bob: untouched
                await still.send(type="session.create")
                await still.until("session.created")
                b = Client(bob)
                await b.send(type="session.create")
                await b.until("session.created")
                engine.runtime.script = lambda prompt: "short"
                done = await b.turn("bob goes on")
                return event, code, reason, done

        error, code, reason, done = asyncio.run(scenario())
        assert error["code"] == "key_revoked" and "removed" in error["message"]
        assert (code, reason) == (1008, "key_revoked")
        assert done["finish_reason"] == "stop"
        assert engine.active_turns() == 0  # the closed socket's turn was cancelled
    engine.close()


def test_sighup_and_a_changed_file_reload_the_keys(tmp_path):
    """The app's lifespan in this (main) thread: SIGHUP, then the poller, each put the file's new keys in force."""
    path = tmp_path / "keys"
    path.write_text(f"{KEY_A} alice\n")
    engine = Engine(FakeRuntime(), cache=None)
    app = create_app(engine, ServerSettings(api_keys_file=str(path), keys_poll_s=0.05), model_name="fake")
    keys = app.state.keys

    async def scenario() -> None:
        async with app.router.lifespan_context(app):
            path.write_text(f"{KEY_B} bob\n")
            keys._seen = keys._stamp()  # as if already seen: only SIGHUP can reload now
            os.kill(os.getpid(), signal.SIGHUP)
            await asyncio.sleep(0.2)
            assert keys.authenticate(KEY_B) is not None and keys.authenticate(KEY_A) is None
            path.write_text(f"{KEY_C} carol\n")  # no signal: the poller sees the change
            for _ in range(100):
                await asyncio.sleep(0.02)
                if keys.authenticate(KEY_C) is not None:
                    break
            assert keys.authenticate(KEY_C) is not None and keys.authenticate(KEY_B) is None

    asyncio.run(scenario())
    app.state.sessions.close()
    engine.close()


def test_a_store_reloads_from_its_sources_tells_its_listeners_and_notices_a_changed_file(tmp_path):
    from chat.server.tenancy.auth import KeyRing
    from chat.server.tenancy.key_store import KeyStore

    path = tmp_path / "keys"
    path.write_text(f"{KEY_A} alice\n")
    load = lambda: KeyRing.from_sources(keys_file=str(path))  # noqa: E731
    store, told = KeyStore(load(), load, str(path)), []
    stop = store.subscribe(told.append)
    assert not store.reload_if_changed() and told == []  # unchanged since it was read
    path.write_text(f"{KEY_A} alice\n{KEY_B} bob\n")
    assert store.reload_if_changed() and told == [store.ring] and store.authenticate(KEY_B).id == "bob"
    assert not store.reload_if_changed()  # read: unchanged again
    stop()
    assert store.reload() and len(told) == 1  # a listener that stopped is told nothing
    assert not KeyStore(load()).reload()  # no sources to read again: the ring stays
