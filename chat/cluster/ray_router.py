"""TurncacheRouter: Ray Serve's request router extension point, deciding through a :class:`RoutingTable`.

Ray Serve (2.60, alpha API: the version is pinned) builds one router per deployment handle, in the process that holds
the handle (here: the ingress), and asks it for each request which replicas to try: ``choose_replicas`` returns
ranks, the first most preferred; Serve sends the request to a replica of the first rank that has room
(``max_ongoing_requests``), else the next. This router returns singleton ranks: the table's choice, then the other
replicas by load.

Loads: before routing a turn, the router asks every candidate replica for its queue length (Ray Serve's own probe,
``RunningReplica.get_queue_len``: the turns that replica runs, whoever sent them), so every ingress applies the load
rule to the same figures; a replica that does not answer within ``PROBE_DEADLINE_S`` counts this ingress's own
turns there.

Requests it reads (first positional argument): a :class:`TurnCall` (routed by the table, see
:mod:`chat.cluster.routing`), or a :class:`ToReplica` (control calls: sent to that replica). Anything else goes to
the least busy replica by the table's count.

Why not Ray's own ``PrefixCacheAffinityRouter`` (ray.llm): it matches the prompt's characters in a tree held by a
separate actor that it queries with blocking ``ray.get`` calls while routing, and knows neither sessions nor tenants.
Here the key is the rendered prompt's token blocks salted by tenant (what the engine's cache is keyed by), sessions
are pinned, and the state is a table in the router's own process.
"""

from __future__ import annotations

import asyncio
import logging

from ray.exceptions import ActorDiedError
from ray.serve.request_router import PendingRequest, ReplicaID, RequestRouter, RunningReplica

from chat.cluster.routing import RoutingPolicy, table_for
from chat.cluster.wire import ToReplica, TurnCall

log = logging.getLogger("turncache.cluster")
PROBE_DEADLINE_S = 0.5  # how long a routing decision waits for the replicas' queue lengths


def table_name(app_name: str, deployment_name: str) -> str:
    """The registry name of the table of one engine deployment (``chat.cluster.routing.table_for``)."""
    return f"{app_name}/{deployment_name}"


class TurncacheRouter(RequestRouter):
    def initialize_state(self, policy: dict | None = None, **_ignored) -> None:
        """Called by Ray Serve with ``RequestRouterConfig.request_router_kwargs``."""
        name = table_name(self._deployment_id.app_name, self._deployment_id.name)
        self.table = table_for(name, RoutingPolicy(**(policy or {})))  # shared with the ingress of this process
        self._calls: dict[str, str] = {}  # Ray's internal request id -> our call id, while the turn runs
        self._dead: set[str] = set()  # replicas whose probe said they died (before Ray Serve stops listing them)

    async def choose_replicas(
        self, candidate_replicas: list[RunningReplica], pending_request: PendingRequest | None = None
    ) -> list[list[RunningReplica]]:
        if not candidate_replicas:
            return []
        if pending_request is not None:
            pending_request.routing_context.should_backoff = True  # back off between rounds when every rank is full
        by_id = {r.replica_id.unique_id: r for r in candidate_replicas}
        first = pending_request.args[0] if pending_request is not None and pending_request.args else None
        if isinstance(first, ToReplica):
            target = by_id.get(first.replica)
            return [[target]] if target is not None else [candidate_replicas]
        if not isinstance(first, TurnCall):  # an untagged call (describe): the least busy replica first
            ranked = sorted(by_id, key=lambda r: (self.table.load(r), r))
            return [[by_id[r]] for r in ranked]
        lengths = await self.queue_lengths(candidate_replicas) if self.table.policy.mode == "prefix" else {}
        decision = self.table.choose(first.route, [r for r in by_id if r not in self._dead], lengths)
        if decision is None:
            return []
        return [[by_id[r]] for r in decision.ranked]

    async def queue_lengths(self, replicas: list[RunningReplica]) -> dict[str, int]:
        """Each replica's own count of the requests it runs; replicas that did not answer in time are left out."""

        async def one(replica: RunningReplica) -> int | None:
            try:
                return await asyncio.wait_for(replica.get_queue_len(deadline_s=PROBE_DEADLINE_S), PROBE_DEADLINE_S)
            except ActorDiedError:  # gone (killed, crashed): never chosen again, its keys go to the next by the hash
                self.on_replica_actor_died(replica.replica_id)
                return None
            except Exception:  # slow or unavailable: the table's own count stands in (see the module docstring)
                return None

        found = await asyncio.gather(*(one(r) for r in replicas))
        return {r.replica_id.unique_id: n for r, n in zip(replicas, found, strict=True) if n is not None}

    def on_request_routed(self, pending_request: PendingRequest, replica_id: ReplicaID, result) -> None:
        first = pending_request.args[0] if pending_request.args else None
        if isinstance(first, TurnCall):
            self._calls[pending_request.metadata.internal_request_id] = first.route.call_id
            self.table.routed(first.route.call_id, replica_id.unique_id)

    def on_request_completed(self, replica_id: ReplicaID, internal_request_id: str) -> None:
        call_id = self._calls.pop(internal_request_id, None)
        if call_id is not None:
            self.table.finished(call_id)

    def update_replicas(self, replicas: list[RunningReplica]) -> None:
        super().update_replicas(replicas)
        self.table.replicas_changed([r.replica_id.unique_id for r in replicas])

    def on_replica_actor_died(self, replica_id: ReplicaID) -> None:
        super().on_replica_actor_died(replica_id)
        self._dead.add(replica_id.unique_id)
        log.warning("replica %s died; its sessions will be pinned anew", replica_id.unique_id)
        self.table.replica_lost(replica_id.unique_id)
