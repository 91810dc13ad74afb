"""The cluster benchmarks' workload on the client side: conversations sent at once over WebSockets, each turn's
record (:class:`ClusterTurn`), and the figures read from the records (cached share, turns that stayed on their
replica). Used by ``bench cluster`` (:mod:`chat.tools.bench.cluster_bench`) and its ingress and failover phases
(:mod:`chat.tools.bench.cluster_failover`)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import dataclass

from chat.tools.bench.multiturn_bench import SYSTEM, Turn


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


def ratio(records: list[ClusterTurn]) -> float:
    return sum(r.cached_tokens for r in records) / max(1, sum(r.prompt_tokens for r in records))


def stayed_share(records: list[ClusterTurn]) -> float:
    """Of the turns after a conversation's first, the share whose cached tokens cover the previous turn's prompt."""
    prompts = {(r.conversation, r.turn): r.prompt_tokens for r in records}
    later = [r for r in records if (r.conversation, r.turn - 1) in prompts]
    stayed = [r for r in later if r.cached_tokens >= prompts[(r.conversation, r.turn - 1)]]
    return len(stayed) / len(later) if later else float("nan")
