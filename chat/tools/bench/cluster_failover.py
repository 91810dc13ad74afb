"""`turncache bench cluster`'s ingress phases: the same replicas behind 1, then 2 ingresses (sessions in a
throwaway PostgreSQL), then failover: an ingress killed mid-turn, then a replica killed.

- **ingresses**: the stateless workload of ``cluster_bench`` (other conversations than the first phases') on one app
  of ``replicas`` engine replicas, first with one ingress, then the same app redeployed with two (Ray Serve keeps the
  engine replicas: only the ingress deployment changes). Both phases send the same conversations, each phase with its
  own system prompt ("Phase 1. ..." / "Phase 2. ...", the same length), so neither finds the other's prefixes cached
  and their figures compare turn for turn; before each, short conversations put that system prompt on every replica.
  ``cached_ratio_by_ingresses``, ``tokens_per_s_by_ingresses`` (prompt and completion tokens over the run's wall
  time), ``ttft_p50_ms_by_ingresses``, ``stayed_share_by_ingresses`` by ingress count.
- **ingress kill** (two ingresses): conversations as WebSocket sessions (``turn.create``), all at once. A baseline run
  without a kill, then a run of other conversations of the same shape in which the ingress running the first
  session's turn ``KILL_TURN`` is SIGKILLed while that turn streams (its first attempt asks for a long reply, so it
  is still running; the turns of other sessions on that ingress that were running are cut too). Every conversation
  whose stream ended (with the proxy's typed ``unavailable`` error, close code 1012) reconnects (retrying the
  connection while the proxy still offers the dead ingress), resumes its session through whatever ingress the proxy
  gives it, and sends the turn again.
  ``ingress_kill_lost_turns``: turns that could not be completed that way; ``ingress_kill_stream_errors``: streams
  that ended with the typed error; ``cached_ratio_after_ingress_kill``: the cached share of the turns from
  ``KILL_TURN`` on in the run with the kill, ``cached_ratio_before_ingress_kill``: of the same turns in the baseline.
- **replica kill**: then one replica (the home of the first conversation's session) is SIGKILLed between turns, and
  every conversation sends one more turn through a new connection: ``replica_kill_lost_conversations`` counts those
  whose turn failed or whose conversation (``conversation.get``) is not every user message sent, in order.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from dataclasses import dataclass, replace

from chat.tools.bench.cluster_workload import ClusterTurn, run_workload, stayed_share, warm_up
from chat.tools.bench.multiturn_bench import SYSTEM, MultiTurnConfig, Turn, make_workload

APP = "bench-cluster-ingresses"
KILL_TURN = 2  # 0-based: the turn during which the ingress is killed
LONG_REPLY = 256  # max_tokens of the killed turn's first attempt: still streaming when the kill comes
SERVICE_RESTART = 1012  # the close code of a stream whose ingress died (chat.cluster.proxy_guard)


@dataclass
class Failover:
    records: list[ClusterTurn]
    lost_turns: int = 0  # turns that could not be completed after a reconnect
    typed_stream_errors: int = 0  # streams ended by the dead ingress's typed error
    other_errors: int = 0


def _tokens_per_s(records: list[ClusterTurn], wall_s: float) -> float:
    return sum(r.prompt_tokens + r.completion_tokens for r in records if r.error is None) / wall_s


def _ratio(records: list[ClusterTurn]) -> float:
    ok = [r for r in records if r.error is None]
    return sum(r.cached_tokens for r in ok) / max(1, sum(r.prompt_tokens for r in ok))


async def _session_conversation(
    url: str, index: int, turns: list[Turn], out: Failover, sessions: dict, kill: asyncio.Event | None
) -> None:
    """One conversation as a session; on a lost connection: reconnect, resume, send the turn again (once)."""
    from chat.tools.client import AsyncChatClient, ChatError, ClientError, ConnectionLost

    client = await AsyncChatClient(url, timeout=600).connect()
    try:
        info = await client.create_session(system=SYSTEM, sampling={"temperature": 0.0})
        sessions[index] = info.id
        for t, turn in enumerate(turns):
            killed_turn = kill is not None and t == KILL_TURN
            for attempt in (0, 1):
                budget = LONG_REPLY if killed_turn and attempt == 0 and index == 0 else turn.reply_budget
                try:
                    await client.update_session(sampling={"temperature": 0.0, "max_tokens": budget})
                    stream = client.send(turn.user)
                    async for _ in stream:
                        if killed_turn and attempt == 0 and index == 0:
                            kill.set()  # the first conversation's turn is streaming: time to kill its ingress
                    reply = stream.reply
                    out.records.append(
                        ClusterTurn(
                            index, t, reply.prompt_tokens, reply.cached_tokens, None, None, reply.completion_tokens
                        )
                    )
                    break
                except ConnectionLost as exc:
                    if exc.close_code == SERVICE_RESTART:
                        out.typed_stream_errors += 1
                    else:
                        out.other_errors += 1
                    if attempt == 1:
                        out.lost_turns += 1
                        return
                    await client.close()
                    client = await _reconnect(url, info.id)
                except (ChatError, ClientError) as exc:
                    out.other_errors += 1
                    out.lost_turns += 1
                    out.records.append(ClusterTurn(index, t, 0, 0, None, f"{type(exc).__name__}: {exc}"))
                    return
    finally:
        await client.close()


async def _reconnect(url: str, session_id: str, tries: int = 20):
    """A new connection with ``session_id`` resumed (the proxy may need a moment to stop offering a dead ingress).

    Raises:
        ClientError: still failing after ``tries`` attempts.
    """
    from chat.tools.client import AsyncChatClient, ClientError

    for attempt in range(tries):
        client = AsyncChatClient(url, timeout=600)
        try:
            await client.connect()
            await client.resume_session(session_id)
            return client
        except ClientError:
            await client.close()
            if attempt == tries - 1:
                raise
            await asyncio.sleep(0.5)
    raise AssertionError("unreachable")


async def _sessions_run(url: str, workload: list[list[Turn]], kill_pid=None) -> tuple[Failover, dict]:
    out, sessions = Failover([]), {}
    kill = asyncio.Event() if kill_pid is not None else None
    tasks = [_session_conversation(url, i, turns, out, sessions, kill) for i, turns in enumerate(workload)]
    if kill is not None:

        async def killer() -> None:
            await kill.wait()
            os.kill(await asyncio.to_thread(kill_pid, sessions[0]), signal.SIGKILL)

        tasks.append(killer())
    await asyncio.gather(*tasks)
    return out, sessions


async def _one_more_turn(url: str, session_id: str, expected: list[str], turn: Turn) -> str | None:
    """Resume through a new connection, run one turn, and check the conversation: None when all is there, else
    what went wrong."""
    from chat.tools.client import AsyncChatClient, ChatError, ClientError

    try:
        async with AsyncChatClient(url, timeout=600) as client:
            await client.resume_session(session_id)
            await client.update_session(sampling={"temperature": 0.0, "max_tokens": turn.reply_budget})
            await client.send(turn.user)
            conversation = await client.conversation()
    except (ChatError, ClientError) as exc:
        return f"{type(exc).__name__}: {exc}"
    users = [m.content for m in conversation.messages if m.role == "user"]
    return None if users == [*expected, turn.user] else f"conversation has {len(users)} user messages"


async def _warm_system_prompt(url: str, system: str, conversations: int = 8) -> None:
    """Short conversations that open with the workload's system prompt: with their keys spread by the hash, every
    replica holds it before a phase's workload starts."""
    from chat.tools.client import AsyncChatClient

    async with AsyncChatClient(url, timeout=600) as client:
        for i in range(conversations):
            messages = [{"role": "system", "content": system}, {"role": "user", "content": f"warm up {i}"}]
            await client.complete(messages, sampling={"temperature": 0.0, "max_tokens": 1})


def holder_pid(db_url: str):
    """session id -> the process id of the ingress holding it (its row's holder, as the database names it)."""
    import psycopg

    from chat.server.persistence.pg_database import PgDatabase

    def find(session_id: str) -> int:
        with psycopg.connect(db_url) as c:
            (holder,) = c.execute("SELECT holder FROM sessions WHERE id = %s", (session_id,)).fetchone()
        db = PgDatabase(db_url)
        try:
            pid = db.holder_pid(holder)
        finally:
            db.close()
        if pid is None:
            raise RuntimeError(f"no live ingress holds session {session_id}")
        return pid

    return find


def run_ingress_phases(runtime, cfg: MultiTurnConfig, *, model: str, replicas: int, port: int, db_url: str) -> dict:
    """The ingress phases and failover on the Ray cluster this process is connected to."""
    import httpx
    from ray import serve

    from chat.cluster.launch import deploy
    from chat.cluster.routing import rendezvous
    from chat.cluster.settings import ClusterSettings
    from chat.cluster.wire import ToReplica
    from chat.server.settings import ServerSettings

    settings = ServerSettings(model=model, port=port, sessions_db=db_url)
    url, http = f"ws://127.0.0.1:{port}/v1/ws", f"http://127.0.0.1:{port}"
    result: dict = {"ingresses": [1, 2], "cached_ratio_by_ingresses": {}, "tokens_per_s_by_ingresses": {}}
    result["ttft_p50_ms_by_ingresses"], result["stayed_share_by_ingresses"] = {}, {}
    workload = make_workload(runtime, replace(cfg, seed=cfg.seed + 101))  # other conversations than the first phases
    errors = 0
    replica_sets = []
    try:
        for m in (1, 2):
            deploy(settings, ClusterSettings(replicas=replicas, ingresses=m), name=APP, route_prefix="/")
            replica_sets.append(sorted(r["replica"] for r in httpx.get(http + "/v1/cluster").json()["replicas"]))
            system = f"Phase {m}. {SYSTEM}"  # the same conversations, none of whose prefixes the other phase cached
            asyncio.run(warm_up(url, replicas))
            asyncio.run(_warm_system_prompt(url, system))  # every replica holds the system prompt, in both phases
            records, wall = asyncio.run(run_workload(url, workload, system=system))
            result["stayed_share_by_ingresses"][str(m)] = stayed_share([r for r in records if r.error is None])
            errors += sum(r.error is not None for r in records)
            ok = sorted(r.ttft_ms for r in records if r.ttft_ms is not None)
            result["cached_ratio_by_ingresses"][str(m)] = _ratio(records)
            result["tokens_per_s_by_ingresses"][str(m)] = _tokens_per_s(records, wall)
            result["ttft_p50_ms_by_ingresses"][str(m)] = ok[len(ok) // 2] if ok else float("nan")
        result["same_replicas_for_both_ingress_counts"] = replica_sets[0] == replica_sets[1]
        one, two = result["cached_ratio_by_ingresses"].values()
        result["cached_ratio_2_ingresses_vs_1"] = two / one if one else float("nan")

        fcfg = replace(cfg, conversations=max(2, cfg.conversations // 2))
        before, _ = asyncio.run(_sessions_run(url, make_workload(runtime, replace(fcfg, seed=cfg.seed + 201))))
        killed_workload = make_workload(runtime, replace(fcfg, seed=cfg.seed + 202))
        t0 = time.perf_counter()
        after, sessions = asyncio.run(_sessions_run(url, killed_workload, kill_pid=holder_pid(db_url)))
        result["failover_wall_s"] = time.perf_counter() - t0
        errors += before.other_errors + after.other_errors
        result["ingress_kill_lost_turns"] = before.lost_turns + after.lost_turns
        result["ingress_kill_stream_errors"] = after.typed_stream_errors
        result["cached_ratio_before_ingress_kill"] = _ratio([r for r in before.records if r.turn >= KILL_TURN])
        result["cached_ratio_after_ingress_kill"] = _ratio([r for r in after.records if r.turn >= KILL_TURN])
        b, a = result["cached_ratio_before_ingress_kill"], result["cached_ratio_after_ingress_kill"]
        result["cached_ratio_after_vs_before_ingress_kill"] = a / b if b else float("nan")

        engines = serve.get_deployment_handle("EngineReplica", APP)
        live = sorted(r["replica"] for r in httpx.get(http + "/v1/cluster").json()["replicas"])
        victim = rendezvous("session:" + sessions[0], live)[0]
        os.kill(engines.report.remote(ToReplica(victim)).result().pid, signal.SIGKILL)
        extra = make_workload(runtime, replace(fcfg, seed=cfg.seed + 203, turns_per_conversation=1))

        async def everyone() -> list[str | None]:
            return await asyncio.gather(
                *(
                    _one_more_turn(url, sessions[i], [t.user for t in killed_workload[i]], extra[i][0])
                    for i in range(len(killed_workload))
                    if i in sessions
                )
            )

        failures = [f for f in asyncio.run(everyone()) if f is not None]
        result["replica_kill_lost_conversations"] = len(failures) + (len(killed_workload) - len(sessions))
        result["replica_kill_failures"] = failures
        result["replica_kill_moved_conversations"] = sum(
            rendezvous("session:" + sessions[i], live)[0] == victim for i in sessions
        )
    finally:
        serve.delete(APP)
    result["errors_ingress_phases"] = errors
    return result
