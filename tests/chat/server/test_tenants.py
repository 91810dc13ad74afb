"""Two tenants on one live server, each trying the other's session ids on every entry point.

Entry points that name a session or something inside one (read from chat/protocol and chat/server):
WebSocket ``session.resume`` (session id), ``turn.cancel`` (turn id), ``turn.edit`` (message id), and the events that
need a bound session (``turn.create``, ``turn.regenerate``, ``session.update``, ``conversation.get``); HTTP has no
route that names a session (``/v1/chat/completions`` is stateless: there the cache salt is what separates tenants);
the web UI resumes sessions over the same WebSocket (tests/web/test_chat_ui.py). The answer to another tenant's id
must be the answer to an id that does not exist, byte for byte apart from the id.
"""

from __future__ import annotations

import asyncio
import json

import httpx
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from tests.chat.server.conftest import make_server
from tests.chat.server.surfaces.test_ws import Client, ws_url

KEY_A = "alice-key-0123456789abcdef"
KEY_A2 = "alice-rotated-key-0123456789"
KEY_B = "bob-key-fedcba9876543210xyz"
KEYS = f"{KEY_A} alice\n{KEY_A2} alice\n{KEY_B} bob\n"
SECRET_PROMPT = "alice's private system prompt " * 8
MISSING = "sess_000000000000000000000000"


def keyed_server(tmp_path, **settings):
    path = tmp_path / "keys"
    path.write_text(KEYS)
    return make_server(api_keys_file=str(path), **settings)


def as_(key: str) -> dict:
    return {"additional_headers": {"Authorization": f"Bearer {key}"}}


async def raw_answer(ws, event: dict) -> str:
    """The raw frame answering ``event`` (skipping nothing: the next frame must be the answer)."""
    await ws.send(json.dumps(event))
    return await asyncio.wait_for(ws.recv(), 30)


async def alice_session(url: str) -> tuple[str, str, str]:
    """Alice's session with one turn: (session id, user message id, reply text)."""
    async with connect(url, **as_(KEY_A)) as ws:
        c = Client(ws)
        await c.send(type="session.create", system=SECRET_PROMPT)
        created, _ = await c.until("session.created")
        done = await c.turn("alice's first question")
        await c.send(type="conversation.get")
        conversation, _ = await c.until("conversation")
        return created["session"]["id"], conversation["messages"][0]["id"], done["text"]


async def resumed_system(url: str, key: str, session_id: str) -> str:
    """The system prompt of ``session_id`` as ``session.resumed`` shows it to the holder of ``key``."""
    async with connect(url, **as_(key)) as ws:
        c = Client(ws)
        await c.send(type="session.resume", session_id=session_id)
        resumed, _ = await c.until("session.resumed")
        return resumed["session"]["system"]


async def probe_ws(url: str, key: str, foreign_session: str, foreign_message: str) -> dict[str, tuple[str, str]]:
    """For each entry point: (answer to the foreign id, answer to a missing id), ids replaced by a placeholder."""
    answers: dict[str, tuple[str, str]] = {}
    async with connect(url, **as_(key)) as ws:
        resume = {"type": "session.resume", "event_id": "r"}
        answers["session.resume"] = (
            (await raw_answer(ws, {**resume, "session_id": foreign_session})).replace(foreign_session, "<id>"),
            (await raw_answer(ws, {**resume, "session_id": MISSING})).replace(MISSING, "<id>"),
        )
        # not bound to anything after the refusals: events that need a session get no_session
        for kind in ("conversation.get", "turn.regenerate"):
            answers[kind] = (await raw_answer(ws, {"type": kind, "event_id": "x"}), "")
        # bound to a session of its own, the other tenant's ids mean nothing inside it
        c = Client(ws)
        await c.send(type="session.create")
        await c.until("session.created")
        await c.turn("my own question")
        edit = {"type": "turn.edit", "content": "hijack", "event_id": "e"}
        answers["turn.edit"] = (
            (await raw_answer(ws, {**edit, "message_id": foreign_message})).replace(foreign_message, "<id>"),
            (await raw_answer(ws, {**edit, "message_id": "msg_missing"})).replace("msg_missing", "<id>"),
        )
    return answers


def assert_answered_as_missing(answers: dict) -> None:
    """What :func:`probe_ws` saw: another tenant's session answered exactly as an id that does not exist."""
    foreign, missing = answers["session.resume"]
    assert foreign == missing  # byte for byte, apart from the id
    assert json.loads(foreign) == {
        "type": "error",
        "reply_to": "r",
        "code": "unknown_session",
        "message": "no session has id '<id>'",
    }
    for kind in ("conversation.get", "turn.regenerate"):
        assert json.loads(answers[kind][0])["code"] == "no_session", answers[kind]
    assert answers["turn.edit"][0] == answers["turn.edit"][1]
    assert json.loads(answers["turn.edit"][0])["code"] == "invalid_event"
    assert SECRET_PROMPT.strip() not in json.dumps(answers)


def test_two_tenants_never_reach_each_others_sessions(tmp_path):
    engine, srv = keyed_server(tmp_path, sessions_db=str(tmp_path / "sessions.sqlite3"))
    with srv:
        url = ws_url(srv)
        alice_id, alice_msg, _ = asyncio.run(alice_session(url))
        answers = asyncio.run(probe_ws(url, KEY_B, alice_id, alice_msg))
        assert_answered_as_missing(answers)
        # the owner, with either of her keys, still resumes it
        assert asyncio.run(resumed_system(url, KEY_A, alice_id)) == SECRET_PROMPT
        assert asyncio.run(resumed_system(url, KEY_A2, alice_id)) == SECRET_PROMPT
    engine.close()
    # the same database, a new server: sessions come back from disk with their owner
    engine, srv = keyed_server(tmp_path, sessions_db=str(tmp_path / "sessions.sqlite3"))
    with srv:
        again = asyncio.run(probe_ws(ws_url(srv), KEY_B, alice_id, alice_msg))
        assert again["session.resume"] == answers["session.resume"]
        assert asyncio.run(resumed_system(ws_url(srv), KEY_A2, alice_id)) == SECRET_PROMPT
    engine.close()


def test_a_tenant_cannot_cancel_another_tenants_turn(tmp_path):
    engine, srv = keyed_server(tmp_path)
    engine.runtime.script = lambda prompt: "word " * 60
    engine.runtime.delay_s = 0.01
    with srv:
        url = ws_url(srv)

        async def scenario() -> tuple[str, str, dict]:
            async with connect(url, **as_(KEY_A)) as alice_ws, connect(url, **as_(KEY_B)) as bob_ws:
                alice = Client(alice_ws)
                await alice.send(type="session.create")
                await alice.until("session.created")
                await alice.send(type="turn.create", content="a long answer please")
                started, _ = await alice.until("turn.started")
                turn_id = started["turn_id"]
                bob = Client(bob_ws)
                await bob.send(type="session.create")
                await bob.until("session.created")
                foreign = await raw_answer(bob_ws, {"type": "turn.cancel", "turn_id": turn_id, "event_id": "c"})
                missing = await raw_answer(bob_ws, {"type": "turn.cancel", "turn_id": "turn_nope", "event_id": "c"})
                done, _ = await alice.until("reply.done")
                return foreign.replace(turn_id, "<id>"), missing.replace("turn_nope", "<id>"), done

        foreign, missing, done = asyncio.run(scenario())
    engine.close()
    assert foreign == missing and json.loads(foreign)["code"] == "not_generating"
    assert done["finish_reason"] in ("stop", "length")  # not "cancelled": alice's turn ran to its end


def test_anonymous_clients_are_refused_and_http_names_no_session(tmp_path):
    engine, srv = keyed_server(tmp_path)
    with srv:
        url = ws_url(srv)
        alice_id, _, _ = asyncio.run(alice_session(url))

        async def anonymous(**kwargs) -> int | None:
            try:
                async with connect(url, **kwargs) as ws:
                    await ws.send(json.dumps({"type": "session.resume", "session_id": alice_id}))
                    await asyncio.wait_for(ws.recv(), 10)
                    return None
            except ConnectionClosed as exc:
                return exc.rcvd.code if exc.rcvd else None
            except Exception as exc:  # refused during the handshake
                return getattr(getattr(exc, "response", None), "status_code", -1)

        assert asyncio.run(anonymous()) in (1008, 403)
        assert asyncio.run(anonymous(additional_headers={"Authorization": "Bearer " + KEY_A[:-1]})) in (1008, 403)
        body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
        assert httpx.post(f"{srv.url}/v1/chat/completions", json=body, timeout=30).status_code == 401
        for path in (f"/v1/sessions/{alice_id}", f"/v1/sessions/{MISSING}"):  # no such route, for anyone
            answer = httpx.get(srv.url + path, headers={"authorization": f"Bearer {KEY_B}"}, timeout=30)
            assert (answer.status_code, answer.text) == (404, '{"detail":"Not Found"}')
    engine.close()


def test_the_cache_salt_comes_from_the_tenant_not_the_key(tmp_path):
    engine, srv = keyed_server(tmp_path)
    body = {"messages": [{"role": "system", "content": SECRET_PROMPT}, {"role": "user", "content": "q"}]}
    with srv:

        def cached(key: str) -> int:
            headers = {"authorization": f"Bearer {key}"}
            r = httpx.post(f"{srv.url}/v1/chat/completions", json={**body, "max_tokens": 2}, headers=headers)
            return r.json()["usage"]["prompt_tokens_details"]["cached_tokens"]

        assert cached(KEY_A) == 0
        assert cached(KEY_B) == 0  # another tenant: cold
        assert cached(KEY_A2) > 0  # alice's other key: her own namespace
    engine.close()


def test_an_open_server_is_one_tenant(tmp_path):
    """Without keys: anyone who knows a session id resumes it, whatever token it sends (docs/security.md)."""
    engine, srv = make_server()
    with srv:
        url = ws_url(srv)

        async def scenario() -> list[str]:
            async with connect(url) as ws:
                c = Client(ws)
                await c.send(type="session.create", system="open")
                created, _ = await c.until("session.created")
            systems = []
            for extra in ({}, as_("any-token-at-all")):
                async with connect(url, **extra) as ws:
                    c = Client(ws)
                    await c.send(type="session.resume", session_id=created["session"]["id"])
                    resumed, _ = await c.until("session.resumed")
                    systems.append(resumed["session"]["system"])
            return systems

        assert asyncio.run(scenario()) == ["open", "open"]
    engine.close()


def test_keys_never_reach_the_logs(tmp_path, caplog):
    import logging

    caplog.set_level(logging.DEBUG)
    engine, srv = keyed_server(tmp_path, sessions_db=str(tmp_path / "sessions.sqlite3"))
    with srv:
        body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
        for key in (KEY_A, KEY_B, KEY_A + "-wrong"):
            httpx.post(f"{srv.url}/v1/chat/completions", json=body, headers={"authorization": f"Bearer {key}"})
        asyncio.run(alice_session(ws_url(srv)))
    engine.close()
    client_side = ("websockets.client", "httpx", "httpcore")  # this test's own clients log their requests
    server_log = "\n".join(
        r.getMessage() + str(r.exc_info or "") for r in caplog.records if not r.name.startswith(client_side)
    )
    assert server_log  # the server's log is really captured
    assert "alice-key" not in server_log and "bob-key" not in server_log
