"""Two ingresses and two replicas on one machine (the Ray cluster of conftest.py, shared with test_live.py), sessions in
a real PostgreSQL server: a conversation moves between ingresses with its history and its cache, the conflict rule
holds across them, and each kind of failover keeps conversations whole. One app for the module; the kill tests are
last.

Which ingress answered is read from the ``x-turncache-ingress`` header of each response and handshake.
"""

from __future__ import annotations

import itertools
import json
import os
import signal
import time
from dataclasses import dataclass

import httpx
import psycopg
import pytest
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

pytestmark = pytest.mark.slow  # and on one xdist worker with the other Ray file (tests/conftest.py: ONE_WORKER_FILES)

ray = pytest.importorskip("ray", reason="the cluster extra (turncache[cluster]) is not installed")

SYSTEM = "You are a careful assistant."
REPLY = {"max_tokens": 6, "logit_bias": {"2": -100}}  # short, full-length replies (no end token)
LONG = {"max_tokens": 3000, "logit_bias": {"2": -100}}


def opening(index: int) -> str:
    return f"Conversation {index} is about tides. " + " ".join(f"Fact {n} about tides matters." for n in range(10))


@dataclass
class Live:
    http: str
    ws: str
    db: str  # the sessions database
    engines: object  # the EngineReplica deployment's handle


@pytest.fixture(scope="module")
def live(postgres_server, ray_nodes):
    from ray import serve

    from chat.cluster.launch import deploy
    from chat.cluster.settings import ClusterSettings
    from chat.server.settings import ServerSettings

    with psycopg.connect(postgres_server, autocommit=True) as db:  # a database of its own
        db.execute("DROP DATABASE IF EXISTS ingresses")
        db.execute("CREATE DATABASE ingresses")
    url = postgres_server.rsplit("/", 1)[0] + "/ingresses"
    port = ray_nodes.up().port
    settings = ServerSettings(model="tiny-llama", port=port, sessions_db=url)
    deploy(settings, ClusterSettings(replicas=2, replica_cpus=0, ingresses=2))
    engines = serve.get_deployment_handle("EngineReplica", "turncache")
    return Live(f"http://127.0.0.1:{port}", f"ws://127.0.0.1:{port}/v1/ws", url, engines)


# ---------------------------------------------------------------- helpers


class Socket:
    def __init__(self, live: Live):
        self.ws = connect(live.ws, open_timeout=60)
        self.ingress = self.ws.response.headers["x-turncache-ingress"]

    def request(self, event: dict, answer: str) -> dict:
        self.ws.send(json.dumps(event))
        while True:
            got = json.loads(self.ws.recv(timeout=120))
            if got["type"] in (answer, "error"):
                return got

    def turn(self, content: str) -> dict:
        done = self.request({"type": "turn.create", "content": content}, "reply.done")
        assert done["type"] == "reply.done", done
        return done

    def close(self):
        self.ws.close()


def socket_on(live: Live, ingress: str | None = None, other_than: str | None = None, tries: int = 40) -> Socket:
    """A socket that Ray Serve's proxy gave to ``ingress`` (or to any but ``other_than``)."""
    for _ in range(tries):
        s = Socket(live)
        if (ingress is None or s.ingress == ingress) and s.ingress != other_than:
            return s
        s.close()
    raise AssertionError(f"no connection reached the ingress asked for in {tries} tries")


def cached(done: dict) -> float:
    usage = done["usage"]
    return usage["prompt_tokens_details"]["cached_tokens"] / usage["prompt_tokens"]


def replicas(live: Live) -> list[str]:
    return sorted(r["replica"] for r in httpx.get(live.http + "/v1/cluster", timeout=30).json()["replicas"])


def holder_pid(live: Live, session_id: str) -> int:
    from chat.server.persistence.pg_database import PgDatabase

    with psycopg.connect(live.db) as c:
        (holder,) = c.execute("SELECT holder FROM sessions WHERE id = %s", (session_id,)).fetchone()
    db = PgDatabase(live.db)
    try:
        return db.holder_pid(holder)
    finally:
        db.close()


def new_session(live: Live, index: int) -> tuple[Socket, str]:
    s = Socket(live)
    created = s.request({"type": "session.create", "system": SYSTEM, "sampling": REPLY}, "session.created")
    return s, created["session"]["id"]


# ---------------------------------------------------------------- tests


def test_a_websocket_conversation_alternates_between_ingresses_with_its_history_and_its_cache(live):
    s, sid = new_session(live, 0)
    seen = [s.ingress]
    dones = [s.turn(opening(0))]
    s.close()
    for t in range(1, 12):  # a new connection per turn, resumed wherever the proxy puts it
        s = socket_on(live, other_than=seen[-1])  # the other ingress each time
        assert s.request({"type": "session.resume", "session_id": sid}, "session.resumed")["type"] == "session.resumed"
        seen.append(s.ingress)
        dones.append(s.turn(f"Question {t}: and then?"))
        if t >= 3:
            conversation = s.request({"type": "conversation.get"}, "conversation")
            s.close()
            break
        s.close()
    assert len(set(seen)) == 2 and all(a != b for a, b in itertools.pairwise(seen))
    users = [m["content"] for m in conversation["messages"] if m["role"] == "user"]
    assert users == [opening(0), "Question 1: and then?", "Question 2: and then?", "Question 3: and then?"]
    assert all(cached(d) >= 0.8 for d in dones[1:]), [d["usage"] for d in dones]  # one replica: the session's home


def test_previous_response_id_continues_through_either_ingress_with_its_cache(live):
    ingresses, usages, previous = set(), [], None
    with httpx.Client(base_url=live.http, timeout=120) as client:
        for t in range(8):
            body = {"model": "tiny-llama", "input": opening(1) if t == 0 else f"Part {t}?", "max_output_tokens": 6}
            if previous is not None:
                body["previous_response_id"] = previous
            r = client.post("/v1/responses", json=body, headers={"connection": "close"})
            assert r.status_code == 200, r.text
            ingresses.add(r.headers["x-turncache-ingress"])
            previous = r.json()["id"]
            usages.append(r.json()["usage"])
            if t >= 3 and len(ingresses) == 2:
                break
    assert len(ingresses) == 2  # the chain crossed ingresses: each found the other's stored responses
    for usage in usages[1:]:
        assert usage["input_tokens_details"]["cached_tokens"] / usage["input_tokens"] >= 0.8, usages


def test_the_second_of_two_concurrent_turns_through_two_ingresses_gets_conflict_and_nothing_is_lost(live):
    first, sid = new_session(live, 2)
    first.turn(opening(2))
    second = socket_on(live, other_than=first.ingress)
    second.request({"type": "session.resume", "session_id": sid}, "session.resumed")
    first.request(
        {"type": "session.update", "sampling": {"max_tokens": 200, "logit_bias": {"2": -100}}}, "session.updated"
    )
    first.ws.send(json.dumps({"type": "turn.create", "content": "A longer answer, please."}))
    while json.loads(first.ws.recv(timeout=120))["type"] != "reply.delta":
        pass
    refused = second.request({"type": "turn.create", "content": "Me too!", "event_id": "mine"}, "turn.started")
    assert (refused["type"], refused["code"], refused["reply_to"]) == ("error", "conflict", "mine")
    while (event := json.loads(first.ws.recv(timeout=120)))["type"] != "reply.done":
        assert event["type"] != "error", event
    second.request({"type": "session.resume", "session_id": sid}, "session.resumed")
    after = second.turn("Me too, now.")
    users = [m["content"] for m in second.request({"type": "conversation.get"}, "conversation")["messages"][::2]]
    assert users == [opening(2), "A longer answer, please.", "Me too, now."]
    assert after["finish_reason"] == "length"  # (its cached share is not checked: a tiny model's long random reply
    # does not re-tokenize to the tokens it generated)
    first.close(), second.close()


def test_an_ingress_killed_mid_turn_ends_its_stream_typed_and_the_conversation_goes_on_through_another(live):
    s, sid = new_session(live, 3)
    s.turn(opening(3))
    s.request({"type": "session.update", "sampling": LONG}, "session.updated")
    s.ws.send(json.dumps({"type": "turn.create", "content": "Tell me everything."}))
    while json.loads(s.ws.recv(timeout=120))["type"] != "reply.delta":
        pass
    os.kill(holder_pid(live, sid), signal.SIGKILL)  # the ingress running this turn
    events = []
    with pytest.raises(ConnectionClosed) as closed:
        while True:
            events.append(json.loads(s.ws.recv(timeout=60)))
    last = [e for e in events if e["type"] != "reply.delta"]
    assert [(e["type"], e["code"]) for e in last] == [("error", "unavailable")] and "session.resume" in last[0][
        "message"
    ]
    assert closed.value.rcvd.code == 1012
    again = Socket(live)
    resumed = again.request({"type": "session.resume", "session_id": sid}, "session.resumed")
    assert resumed["session"]["interrupted_turn_id"] and resumed["session"]["messages"] == 2
    again.request({"type": "session.update", "sampling": REPLY}, "session.updated")
    done = again.turn("Shorter, then.")
    assert done["finish_reason"] == "length" and cached(done) >= 0.8  # the same replica: its cache
    again.close()


def test_a_replica_killed_moves_only_its_sessions_to_the_next_by_the_hash_with_their_conversations(live):
    from chat.cluster.routing import rendezvous
    from chat.cluster.wire import ToReplica

    deadline = time.monotonic() + 120  # after the ingress kill, Ray Serve brings the app back to 2 ingresses
    while time.monotonic() < deadline and len(replicas(live)) < 2:
        time.sleep(1)
    live_replicas = replicas(live)
    sessions = []
    for i in range(4):
        s, sid = new_session(live, 10 + i)
        s.turn(opening(10 + i))
        sessions.append((s, sid))
    victim = rendezvous("session:" + sessions[0][1], live_replicas)[0]  # the home of one session at least
    os.kill(live.engines.report.remote(ToReplica(victim)).result().pid, signal.SIGKILL)
    for s, sid in sessions:
        moved = rendezvous("session:" + sid, live_replicas)[0] == victim
        done = s.turn("After the kill?")  # no turn lost: a dead replica is skipped before the turn begins
        following = s.turn("And after that?")
        assert following["usage"]["prompt_tokens_details"]["cached_tokens"] > 0
        assert cached(following) >= 0.8  # its (new) replica holds it
        if not moved:
            assert cached(done) >= 0.8  # untouched by the kill
        users = [m["content"] for m in s.request({"type": "conversation.get"}, "conversation")["messages"][::2]]
        assert users == [opening(10 + sessions.index((s, sid))), "After the kill?", "And after that?"]
        s.close()
