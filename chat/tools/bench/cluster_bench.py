"""`turncache bench cluster`: the multiturn workload, stateless, on a Ray Serve cluster; prefix-affine vs
round-robin routing in one run.

Workload: :mod:`chat.tools.bench.multiturn_bench`'s (8 conversations x 4 turns of 256-512-token user messages, greedy
replies of at most 4-8 tokens, seeded), every conversation at once, each on its own WebSocket sending
``completion.create`` with its whole history every turn (stateless: nothing but the prompt tells the cluster which
conversation a turn belongs to). It runs against ``replicas`` engine replicas routed with ``--router prefix``, then
against fresh replicas (empty caches) routed with ``--router round_robin``, in one local Ray instance started for
the run; each deployment first gets one short warm-up turn per replica.

Time to first token is measured at the client, from sending ``completion.create`` to the first ``reply.delta``: it
includes the ingress, routing, and waiting behind the other conversations on the replica.

Keys: ``model``, ``replicas``, ``conversations``, ``turns_per_conversation``, ``errors`` (both runs),
``cached_token_ratio_affine`` / ``cached_token_ratio_round_robin`` (cached / prompt tokens over all turns),
``ratio_gain`` (affine / round robin), ``ttft_p50_ms_affine`` / ``ttft_p50_ms_round_robin``,
``cached_token_ratio_per_turn_affine`` / ``..._round_robin`` (lists indexed by turn), ``wall_s_affine`` /
``wall_s_round_robin``, ``replicas_used_affine`` / ``replicas_used_round_robin`` (replicas that ran a turn),
``stayed_share_affine`` / ``stayed_share_round_robin``: of the turns after a conversation's first, the share that
ran on the replica of the conversation's previous turn. It is read from the cache: such a turn finds the whole
previous prompt cached (its prompt starts with it); on any other replica it finds at most an earlier, shorter one.
Round robin (one cursor for every turn, whoever sent it) leaves this share to the order in which turns arrive: about
``1 / replicas`` when that order is unrelated to the conversations', more when successive rounds of the (in-step)
conversations arrive in the same order, which sends each conversation back where it was.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass

from chat.tools.bench.multiturn_bench import SYSTEM, MultiTurnConfig, Turn, make_workload
from chat.tools.bench.report import emit

MODES = (("affine", "prefix"), ("round_robin", "round_robin"))  # (key suffix, --router)


@dataclass(frozen=True)
class ClusterTurn:
    conversation: int
    turn: int  # 0-based
    prompt_tokens: int
    cached_tokens: int
    ttft_ms: float | None  # client-side; None when the turn failed
    error: str | None = None
    completion_tokens: int = 0


async def _conversation(
    url: str, index: int, turns: Sequence[Turn], token: str | None, system: str = SYSTEM
) -> list[ClusterTurn]:
    from chat.tools.client import AsyncChatClient, ChatError, ClientError

    records: list[ClusterTurn] = []
    messages: list[dict] = [{"role": "system", "content": system}]
    try:
        async with AsyncChatClient(url, token=token, timeout=600) as client:
            for t, turn in enumerate(turns):
                messages.append({"role": "user", "content": turn.user})
                stream = client.complete(messages, sampling={"temperature": 0.0, "max_tokens": turn.reply_budget})
                sent, first = time.perf_counter(), None
                async for _ in stream:
                    first = first or time.perf_counter()
                reply = stream.reply
                assert reply is not None
                ttft = (first - sent) * 1e3 if first is not None else None
                records.append(
                    ClusterTurn(index, t, reply.prompt_tokens, reply.cached_tokens, ttft, None, reply.completion_tokens)
                )
                messages.append({"role": "assistant", "content": reply.text})
    except (ChatError, ClientError) as exc:  # the conversation cannot go on without its reply
        records.append(ClusterTurn(index, len(records), 0, 0, None, f"{type(exc).__name__}: {exc}"))
    return records


async def run_workload(
    url: str, workload: list[list[Turn]], token: str | None = None, system: str = SYSTEM
) -> tuple[list[ClusterTurn], float]:
    """Every conversation at once against the WebSocket ``url`` (with the API key ``token``, if the cluster has keys),
    each opening with ``system``; returns (records, wall seconds)."""
    t0 = time.perf_counter()
    runs = (_conversation(url, i, turns, token, system) for i, turns in enumerate(workload))
    results = await asyncio.gather(*runs)
    return [r for rs in results for r in rs], time.perf_counter() - t0


async def warm_up(url: str, replicas: int) -> None:
    """One short turn per replica (distinct prompts: the least-loaded rule spreads them; round robin too)."""
    from chat.tools.client import AsyncChatClient

    async with AsyncChatClient(url, timeout=600) as client:
        for i in range(replicas):
            await client.complete(
                [{"role": "user", "content": f"warm up {i}"}], sampling={"temperature": 0.0, "max_tokens": 2}
            )


def _ratio(records: list[ClusterTurn]) -> float:
    return sum(r.cached_tokens for r in records) / max(1, sum(r.prompt_tokens for r in records))


def _stayed_share(records: list[ClusterTurn]) -> float:
    """Of the turns after a conversation's first, the share whose cached tokens cover the previous turn's prompt."""
    prompts = {(r.conversation, r.turn): r.prompt_tokens for r in records}
    later = [r for r in records if (r.conversation, r.turn - 1) in prompts]
    stayed = [r for r in later if r.cached_tokens >= prompts[(r.conversation, r.turn - 1)]]
    return len(stayed) / len(later) if later else float("nan")


def summarize(cfg: MultiTurnConfig, runs: dict[str, list[ClusterTurn]]) -> dict:
    """The benchmark's figures from each mode's records (keys of ``runs``: "affine", "round_robin")."""
    out: dict = {"errors": sum(r.error is not None for rs in runs.values() for r in rs)}
    for mode, records in runs.items():
        ok = [r for r in records if r.error is None]
        ttfts = [r.ttft_ms for r in ok if r.ttft_ms is not None]
        out[f"cached_token_ratio_{mode}"] = _ratio(ok)
        out[f"ttft_p50_ms_{mode}"] = statistics.median(ttfts) if ttfts else float("nan")
        out[f"cached_token_ratio_per_turn_{mode}"] = [
            _ratio([r for r in ok if r.turn == t]) for t in range(cfg.turns_per_conversation)
        ]
        out[f"stayed_share_{mode}"] = _stayed_share(ok)
    rr = out.get("cached_token_ratio_round_robin", 0.0)
    out["ratio_gain"] = out.get("cached_token_ratio_affine", 0.0) / rr if rr else float("inf")
    return out


def run_on_cluster(runtime, cfg: MultiTurnConfig, *, model: str, replicas: int, port: int) -> dict:
    """Both modes on the Ray cluster this process is connected to (``chat.cluster.launch.connect``)."""
    from ray import serve

    from chat.cluster.launch import deploy
    from chat.cluster.settings import ClusterSettings
    from chat.server.settings import ServerSettings

    workload = make_workload(runtime, cfg)
    settings = ServerSettings(model=model, port=port, sessions_db=None)
    url = f"ws://127.0.0.1:{port}/v1/ws"
    runs: dict[str, list[ClusterTurn]] = {}
    result: dict = {"model": runtime.name, "replicas": replicas, "conversations": cfg.conversations}
    result["turns_per_conversation"] = cfg.turns_per_conversation
    for mode, router in MODES:
        name = f"bench-cluster-{router}"
        handle = deploy(settings, ClusterSettings(replicas=replicas, router=router), name=name)
        try:
            asyncio.run(warm_up(url, replicas))
            before = len(handle.routing_log.remote().result())
            runs[mode], result[f"wall_s_{mode}"] = asyncio.run(run_workload(url, workload))
            log = handle.routing_log.remote().result()[before:]
            result[f"replicas_used_{mode}"] = len({entry["replica"] for entry in log})
        finally:
            serve.delete(name)
    return {**result, **summarize(cfg, runs)}


TARGETS = {
    "errors": ("==", 0),
    "cached_token_ratio_affine": (">=", 0.55),
    "ratio_gain": (">=", 1.5),
    "cached_ratio_2_ingresses_vs_1": (">=", 0.97),
    "ingress_kill_lost_turns": ("==", 0),
    "cached_ratio_after_vs_before_ingress_kill": (">=", 0.9),
    "replica_kill_lost_conversations": ("==", 0),
}


def main(
    as_json: bool,
    model: str = "smollm2",
    conversations: int = 8,
    replicas: int = 2,
) -> int:
    from chat.cluster.launch import free_port, local_ray
    from chat.models import load_model
    from chat.tools.bench.cluster_failover import run_ingress_phases
    from chat.tools.pg_local import local_postgres

    runtime = load_model(model)  # renders the workload's messages to count their tokens
    cfg = MultiTurnConfig(conversations=conversations)
    with local_postgres() as db_url, local_ray():
        port = free_port()
        result = run_on_cluster(runtime, cfg, model=model, replicas=replicas, port=port)
        phases = run_ingress_phases(runtime, cfg, model=model, replicas=replicas, port=port, db_url=db_url)
    result["errors"] += phases.pop("errors_ingress_phases")
    emit({**result, **phases}, TARGETS, as_json)
    return 0
