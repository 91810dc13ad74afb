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

from chat.tools.bench.cluster_failover import run_ingress_phases
from chat.tools.bench.cluster_workload import ClusterTurn, ratio, run_workload, stayed_share, warm_up
from chat.tools.bench.multiturn_bench import MultiTurnConfig, make_workload
from chat.tools.bench.report import emit

MODES = (("affine", "prefix"), ("round_robin", "round_robin"))  # (key suffix, --router)


def summarize(cfg: MultiTurnConfig, runs: dict[str, list[ClusterTurn]]) -> dict:
    """The benchmark's figures from each mode's records (keys of ``runs``: "affine", "round_robin")."""
    out: dict = {"errors": sum(r.error is not None for rs in runs.values() for r in rs)}
    for mode, records in runs.items():
        ok = [r for r in records if r.error is None]
        ttfts = [r.ttft_ms for r in ok if r.ttft_ms is not None]
        out[f"cached_token_ratio_{mode}"] = ratio(ok)
        out[f"ttft_p50_ms_{mode}"] = statistics.median(ttfts) if ttfts else float("nan")
        out[f"cached_token_ratio_per_turn_{mode}"] = [
            ratio([r for r in ok if r.turn == t]) for t in range(cfg.turns_per_conversation)
        ]
        out[f"stayed_share_{mode}"] = stayed_share(ok)
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
