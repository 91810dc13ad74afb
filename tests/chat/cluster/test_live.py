"""A real Ray cluster on loopback: two Ray nodes (ray.cluster_utils.Cluster), two apps of 2 tiny-llama replicas
each, one replica per node: ``affine`` (--router prefix) at ``/`` and ``rr`` (--router round_robin) at ``/rr``.
Both apps have the keys file of tests/chat/server/test_tenants.py (tenants alice, with two keys, and bob); the tests
act as alice unless they say otherwise.

The tests run in file order and share the apps; the replica-kill test and then the ingress's shutdown are last. The
cluster is shared with test_live_ingresses.py (tests/chat/cluster/conftest.py).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
from collections import defaultdict
from dataclasses import dataclass

import httpx
import pytest
from websockets.sync.client import connect

from chat.cluster.routing import rendezvous
from tests.chat.server.test_tenants import (
    KEY_A,
    KEY_A2,
    KEY_B,
    KEYS,
    SECRET_PROMPT,
    alice_session,
    assert_answered_as_missing,
    probe_ws,
    resumed_system,
)

pytestmark = pytest.mark.slow  # and on one xdist worker with the other Ray file (tests/conftest.py: ONE_WORKER_FILES)

ray = pytest.importorskip("ray", reason="the cluster extra (turncache[cluster]) is not installed")

SYSTEM = "You are a careful assistant."
TOPICS = ["tides", "waves", "salt", "whales", "reefs", "storms", "ice", "currents"]
REPLY_TOKENS = 6  # short replies: a tiny model's random bytes do not re-tokenize to the tokens it generated
AS_ALICE = {"authorization": f"Bearer {KEY_A}"}  # HTTP headers of the tests' default tenant


def ws_connect(url: str, key: str = KEY_A):
    return connect(url, additional_headers={"Authorization": f"Bearer {key}"})


def opening(index: int) -> str:
    """A long first message, its own per conversation: the history, not a shared system prompt, is what a
    conversation finds in its replica's cache."""
    topic = TOPICS[index % len(TOPICS)]
    return f"Conversation {index} is about {topic}. " + " ".join(
        f"Fact {n} about {topic} is worth knowing." for n in range(8)
    )


@dataclass
class Live:
    http: str  # the affine app
    rr_http: str  # the round-robin app
    ws: str  # the affine app's /v1/ws
    affine: object  # the affine ingress's deployment handle
    rr: object
    engines: object  # the affine EngineReplica deployment's handle
    nodes: int
    sessions_db: str  # the affine app's session store


@pytest.fixture(scope="module")
def live(tmp_path_factory, ray_nodes):
    from ray import serve

    from chat.cluster.launch import deploy_many
    from chat.cluster.settings import ClusterSettings
    from chat.server.settings import ServerSettings

    port = ray_nodes.up().port
    folder = tmp_path_factory.mktemp("cluster")
    db, keys = str(folder / "sessions.sqlite3"), folder / "keys"
    keys.write_text(KEYS)
    settings = ServerSettings(model="tiny-llama", port=port, sessions_db=db, api_keys_file=str(keys))
    common = {"replicas": 2, "replica_cpus": 0, "max_replicas_per_node": 1}
    # the affine app's turns never leave their home for load (eight conversations at once are the most in flight):
    # its tests measure the cache that affinity finds, not a busy machine's timing (0.74 once in a fresh-clone run
    # with the default imbalance 4); moves for load are tested in test_ray_router.py
    affine, rr = deploy_many(
        [
            ("affine", "/", settings, ClusterSettings(router="prefix", route_imbalance=8, **common)),
            (
                "rr",
                "/rr",
                settings.model_copy(update={"sessions_db": None}),
                ClusterSettings(router="round_robin", **common),
            ),
        ]
    )
    base = f"http://127.0.0.1:{port}"
    engines = serve.get_deployment_handle("EngineReplica", "affine")
    ws = f"ws://127.0.0.1:{port}/v1/ws"
    return Live(base, base + "/rr", ws, affine, rr, engines, len(ray.nodes()), db)


# ---------------------------------------------------------------- helpers


def routing_log(handle) -> list[dict]:
    return handle.routing_log.remote().result()


def replicas_of(live) -> dict[str, object]:
    """replica id -> its report (pid, node), for every live replica of the affine app."""
    from chat.cluster.wire import ToReplica

    ids = [r["replica"] for r in httpx.get(live.http + "/v1/cluster", headers=AS_ALICE).json()["replicas"]]
    return {r: live.engines.report.remote(ToReplica(r)).result() for r in ids}


async def session_conversation(url: str, index: int, turns: int, token: str = KEY_A) -> tuple[str, list]:
    from chat.tools.client import AsyncChatClient

    async with AsyncChatClient(url, token=token, timeout=120) as client:
        info = await client.create_session(system=SYSTEM, sampling={"max_tokens": REPLY_TOKENS})
        replies = [await client.send(opening(index))]
        for t in range(1, turns):
            replies.append(await client.send(f"Question {t}: what matters most?"))
        return info.id, replies


def openai_conversations(base: str, conversations: int, turns: int, first: int = 0) -> list[list]:
    """Per conversation, each turn's usage; all conversations at once, stateless, through the openai client.
    ``first``: the index (its opening) of the first conversation."""
    from openai import AsyncOpenAI

    async def one(client, index):
        messages = [{"role": "system", "content": SYSTEM}]
        usages = []
        for t in range(turns):
            messages.append({"role": "user", "content": opening(index) if t == 0 else f"And part {t}?"})
            r = await client.chat.completions.create(model="tiny-llama", messages=messages, max_tokens=REPLY_TOKENS)
            usages.append(r.usage)
            messages.append({"role": "assistant", "content": r.choices[0].message.content})
        return usages

    async def everything():
        async with AsyncOpenAI(base_url=base + "/v1", api_key=KEY_A, timeout=120) as client:
            return await asyncio.gather(*(one(client, first + i) for i in range(conversations)))

    return asyncio.run(everything())


def ratio(usages) -> float:
    return sum(u.prompt_tokens_details.cached_tokens for u in usages) / sum(u.prompt_tokens for u in usages)


def ws_turn(ws, content, *, on_delta=None) -> tuple[dict, list[dict]]:
    """Send turn.create; return (reply.done, every event of the turn)."""
    ws.send(json.dumps({"type": "turn.create", "content": content}))
    events = []
    while True:
        event = json.loads(ws.recv(timeout=120))
        events.append(event)
        if event["type"] == "reply.delta" and on_delta is not None:
            on_delta(event)
            on_delta = None
        if event["type"] == "reply.done":
            return event, events


def ws_request(ws, event: dict, answer: str) -> dict:
    ws.send(json.dumps(event))
    while True:
        got = json.loads(ws.recv(timeout=60))
        if got["type"] == answer:
            return got


# ---------------------------------------------------------------- the surface


def test_the_single_process_surface_is_served_by_the_ingress(live):
    assert live.nodes == 2
    assert "<html" in httpx.get(live.http + "/").text.lower()  # the web UI
    assert httpx.get(live.http + "/health").json()["status"] == "ok"
    assert httpx.get(live.http + "/v1/models", headers=AS_ALICE).json()["data"][0]["id"] == "tiny-llama"
    for path in ("/v1/models", "/metrics", "/v1/cluster"):  # the cluster's own routes need a key too
        assert httpx.get(live.http + path).status_code == 401, path
    reports = replicas_of(live)
    assert len(reports) == 2 and len({r.node for r in reports.values()}) == 2  # one replica per Ray node
    for _ in range(5):  # every replica answers every time (concurrent calls of one request each get an id)
        metrics = httpx.get(live.http + "/metrics", headers=AS_ALICE).text
        assert all(f'turncache_turns_total{{replica="{r}"}}' in metrics for r in reports)
    for replica in reports:
        assert f'turncache_turns_total{{replica="{replica}"}}' in metrics
        assert f'turncache_cluster_turns_inflight{{replica="{replica}"}} 0' in metrics
    assert metrics.count("# TYPE turncache_turns_total counter") == 1
    assert "\nturncache_session_write_failures_total 0\n" in metrics  # the ingress's session store, no label
    cluster = httpx.get(live.http + "/v1/cluster", headers=AS_ALICE).json()
    (head,) = [n["NodeID"] for n in ray.nodes() if n["Resources"].get("node:__internal_head__")]
    assert cluster["router"] == "prefix" and cluster["ingress_node"] == head  # where the session store is
    assert httpx.get(live.rr_http + "/v1/cluster", headers=AS_ALICE).json()["router"] == "round_robin"


def test_an_engine_refusal_keeps_its_type_through_the_cluster(live):
    long = "word " * 5000  # over tiny-llama's 4096-token window
    body = {"messages": [{"role": "user", "content": long}]}
    r = httpx.post(live.http + "/v1/chat/completions", json=body, headers=AS_ALICE)
    assert r.status_code == 400 and r.json()["error"]["code"] == "context_overflow"


# ---------------------------------------------------------------- routing


def test_websocket_sessions_stay_on_one_replica_and_hit_the_cache(live):
    async def everything():
        return await asyncio.gather(*(session_conversation(live.ws, i, 4) for i in range(4)))

    before = len(routing_log(live.affine))
    results = asyncio.run(everything())
    log = routing_log(live.affine)[before:]
    replicas = defaultdict(set)
    for entry in log:
        replicas[entry["session_id"]].add(entry["replica"])
    assert sorted(replicas) == sorted(sid for sid, _ in results)
    assert all(len(used) == 1 for used in replicas.values()), replicas  # each session on one replica
    ids = sorted(replicas_of(live))
    for sid, used in replicas.items():  # its home by rendezvous hashing of its id (loads here are far below 4)
        assert used == {rendezvous("session:" + sid, ids)[0]}
    for _, replies in results:
        for reply in replies[1:]:
            assert reply.cached_tokens / reply.prompt_tokens >= 0.8, reply.usage


def test_a_session_turn_and_a_stateless_turn_run_at_once_on_one_socket(live):
    with ws_connect(live.ws) as ws:
        ws_request(ws, {"type": "session.create", "sampling": {"max_tokens": 200}}, "session.created")
        ws.send(json.dumps({"type": "turn.create", "content": "Tell me about waves."}))
        completion = {"type": "completion.create", "messages": [{"role": "user", "content": "And tides?"}]}
        ws.send(json.dumps({**completion, "sampling": {"max_tokens": 200}}))
        done = []
        while len(done) < 2:
            event = json.loads(ws.recv(timeout=60))
            assert event["type"] != "error", event
            if event["type"] == "reply.done":
                done.append(event)
        assert sorted(d.get("message_id") is None for d in done) == [False, True]  # a stored reply, a stateless one
        assert all(d["finish_reason"] in ("stop", "length") for d in done)


def test_stateless_conversations_hit_the_cache_with_prefix_routing_and_less_with_round_robin(live):
    affine = openai_conversations(live.http, conversations=8, turns=4)
    # No turn leaves its home for load here (route_imbalance=8, the fixture): what misses is a tiny model's random
    # reply that re-tokenizes otherwise (template drift, from that reply on).
    assert ratio([u for c in affine for u in c[1:]]) >= 0.8
    for t in range(1, 4):
        assert ratio([c[t] for c in affine]) >= 0.65, t
    # One request at a time, so the rotation is exact: each turn lands on the other replica than the turn before
    # (two replicas), and turn 1 finds none of its conversation's opening there. (Eight conversations at once left
    # the rotation to arrival order: round robin's ratio then ranged 0.5-0.8 from run to run.)
    rr = [openai_conversations(live.rr_http, conversations=1, turns=4, first=i)[0] for i in range(4)]
    assert all(ratio([c[1]]) < 0.5 for c in rr), [ratio([c[1]]) for c in rr]
    affine_later, rr_later = [u for c in affine for u in c[1:]], [u for c in rr for u in c[1:]]
    assert ratio(rr_later) < ratio(affine_later) - 0.1, (ratio(rr_later), ratio(affine_later))


def test_bench_cluster_workload_and_summary_run_against_a_cluster(live):
    from chat.models import load_model
    from chat.tools.bench.cluster_bench import run_workload, summarize
    from chat.tools.bench.multiturn_bench import MultiTurnConfig, make_workload

    cfg = MultiTurnConfig(conversations=2, turns_per_conversation=2, min_user_tokens=40, max_user_tokens=60)
    workload = make_workload(load_model("tiny-llama"), cfg)
    affine, _ = asyncio.run(run_workload(live.ws, workload, KEY_A))
    rr, _ = asyncio.run(run_workload(live.rr_http.replace("http", "ws") + "/v1/ws", workload, KEY_A))
    result = summarize(cfg, {"affine": affine, "round_robin": rr})
    assert result["errors"] == 0 and len(affine) == len(rr) == 4
    for key in ("cached_token_ratio_affine", "cached_token_ratio_round_robin", "ttft_p50_ms_affine"):
        assert result[key] > 0, key
    assert len(result["cached_token_ratio_per_turn_affine"]) == 2
    assert result["stayed_share_affine"] == 1.0  # both second turns ran where their conversation's first did


def test_two_tenants_never_reach_each_others_sessions_through_the_cluster(live):
    """tests/chat/server/test_tenants.py's probe, through the ingress: the same answers as the single process."""
    alice_id, alice_msg, _ = asyncio.run(alice_session(live.ws))
    answers = asyncio.run(probe_ws(live.ws, KEY_B, alice_id, alice_msg))
    assert_answered_as_missing(answers)
    assert asyncio.run(resumed_system(live.ws, KEY_A2, alice_id)) == SECRET_PROMPT  # her other key: her session


def test_two_tenants_share_no_cache_entry_on_any_replica(live):
    """Round robin puts alice's prompt on both replicas, then sends bob's same prompt to both: bob finds nothing."""
    body = {"messages": [{"role": "system", "content": SECRET_PROMPT}, {"role": "user", "content": "Tides?"}]}

    def cached_share(key: str) -> float:
        headers = {"authorization": f"Bearer {key}"}
        r = httpx.post(live.rr_http + "/v1/chat/completions", json={**body, "max_tokens": 2}, headers=headers)
        usage = r.json()["usage"]
        return usage["prompt_tokens_details"]["cached_tokens"] / usage["prompt_tokens"]

    before = len(routing_log(live.rr))
    cached_share(KEY_A), cached_share(KEY_A)
    assert (cached_share(KEY_B), cached_share(KEY_B)) == (0, 0)
    assert cached_share(KEY_A2) > 0.8  # alice's other key: her own entries
    used = [entry["replica"] for entry in routing_log(live.rr)[before:]]
    assert len(used) == 5 and used[0] != used[1] and (used[2], used[3]) == (used[0], used[1])  # strict rotation


# ---------------------------------------------------------------- faults (last: they kill a replica, stop an app)


def test_a_cancelled_turn_ends_cancelled_through_the_cluster(live):
    with ws_connect(live.ws) as ws:
        # the end token (id 2 in the tiny tokenizer) forbidden: a random reply that ended by itself before the cancel
        # came through the ingress would end "stop" (it did, now and then, with the cancel a few hundred tokens late)
        no_end = {"max_tokens": 3000, "logit_bias": {"2": -100}}
        ws_request(ws, {"type": "session.create", "sampling": no_end}, "session.created")
        done, events = ws_turn(ws, "Tell me a very long story.", on_delta=lambda _: ws.send('{"type": "turn.cancel"}'))
        assert done["finish_reason"] == "cancelled" and not any(e["type"] == "error" for e in events)
        assert done["usage"]["completion_tokens"] < 3000
        ws.send(json.dumps({"type": "turn.create", "content": "Another long story."}))
        ws.send('{"type": "turn.cancel"}')  # at once: before (or while) a replica is chosen
        while (event := json.loads(ws.recv(timeout=60)))["type"] != "reply.done":
            assert event["type"] != "error", event
        assert event["finish_reason"] == "cancelled"
        conversation = ws_request(ws, {"type": "conversation.get"}, "conversation")
        assert [m["role"] for m in conversation["messages"]] in (["user", "assistant"], [])  # nothing unanswered


def test_a_replica_killed_mid_turn_ends_that_turn_typed_and_the_next_turn_runs_elsewhere(live):
    with ws_connect(live.ws) as ws:
        created = ws_request(
            ws,
            {"type": "session.create", "system": SYSTEM, "sampling": {"max_tokens": REPLY_TOKENS}},
            "session.created",
        )
        session = created["session"]["id"]
        ws_turn(ws, opening(0))
        home = routing_log(live.affine)[-1]["replica"]
        victim = replicas_of(live)[home]
        # the end token (id 2) forbidden: an unseeded random reply can end "stop" within a few tokens, before the kill
        # lands (seen once under load: no error event)
        long_reply = {"max_tokens": 3000, "logit_bias": {"2": -100}}
        ws_request(ws, {"type": "session.update", "sampling": long_reply}, "session.updated")
        done, events = ws_turn(ws, "Now a long answer.", on_delta=lambda _: os.kill(victim.pid, signal.SIGKILL))
        (error,) = [e for e in events if e["type"] == "error"]
        assert error["code"] == "unavailable" and home in error["message"] and "send the turn again" in error["message"]
        assert done["finish_reason"] == "error"
        # the end token forbidden again: the turn after the kill must run its full length on the other replica
        full_length = {"max_tokens": REPLY_TOKENS, "logit_bias": {"2": -100}}
        ws_request(ws, {"type": "session.update", "sampling": full_length}, "session.updated")
        after, _ = ws_turn(ws, "Second question about tides.")
        assert after["finish_reason"] == "length" and routing_log(live.affine)[-1]["replica"] != home
        following, _ = ws_turn(ws, "Third question about tides.")  # one re-prefill, then hits again
        assert following["usage"]["prompt_tokens_details"]["cached_tokens"] / following["usage"]["prompt_tokens"] >= 0.8
    with ws_connect(live.ws) as ws:  # the store lost nothing: the conversation, without the cut-off turn
        ws_request(ws, {"type": "session.resume", "session_id": session}, "session.resumed")
        conversation = ws_request(ws, {"type": "conversation.get"}, "conversation")
        texts = [m["content"] for m in conversation["messages"] if m["role"] == "user"]
        assert texts == [opening(0), "Second question about tides.", "Third question about tides."]
    deadline = time.monotonic() + 90  # Ray Serve starts a replacement, which rejoins routing
    while time.monotonic() < deadline:
        views = httpx.get(live.http + "/v1/cluster", headers=AS_ALICE).json()["replicas"]
        replicas = {r["replica"] for r in views}
        if len(replicas) == 2 and home not in replicas:
            break
        time.sleep(1)
    assert len(replicas) == 2 and home not in replicas
    (fresh,) = replicas - {routing_log(live.affine)[-1]["replica"]}
    sid = session  # the new replica takes its share of the keys: here, the sessions whose home it is
    for index in range(2, 40):
        sid, _ = asyncio.run(session_conversation(live.ws, index, 1))
        if rendezvous("session:" + sid, sorted(replicas))[0] == fresh:
            break
    assert [e["replica"] for e in routing_log(live.affine) if e["session_id"] == sid] == [fresh]


def test_a_stopped_ingress_closes_its_session_store(live):
    from ray import serve

    from chat.server.persistence.session_db import SqliteSessionStore

    sid, _ = asyncio.run(session_conversation(live.ws, 1, 1))
    assert os.path.exists(live.sessions_db + "-wal")  # open: SQLite's write-ahead log is there
    serve.delete("affine")
    assert not os.path.exists(live.sessions_db + "-wal")  # closed: the log was written into the file and removed
    store = SqliteSessionStore(live.sessions_db)
    try:
        session = store.get(sid, owner="alice")
        assert (session.system, [m.role for m in session.messages]) == (SYSTEM, ["user", "assistant"])
    finally:
        store.close()
