"""Which replica runs a turn: the routing rule, over a table of what each replica holds and runs. Pure: no Ray.

The rule (``mode="prefix"``), for a turn with key :class:`RouteKey` over the live replicas:

1. **session**: a session turn goes to the replica its session is pinned to, whatever that replica's load: moving
   a session costs a full re-prefill, and a session runs one turn at a time. A session's first turn is pinned by
   rule 3 (sessions that share only a system prompt would otherwise all pin to the replica that saw it first); a
   session that lost its pin (its replica was lost, or the ingress restarted) is pinned by rules 2-3, which find
   the replica still holding its conversation if there is one.
2. **prefix**: otherwise, the replica that last served the longest of the turn's block digests (see
   :mod:`chat.cluster.prompt_keys`) is *preferred*; the turn goes there unless that replica runs more than
   ``imbalance`` turns more than the least-loaded replica.
3. **least_loaded**: otherwise (no digest known, or the preferred replica is over the threshold), the replica
   with the fewest turns in progress; ties go to the one with the fewest pinned sessions, then in rotation.

Every routed turn's digests then point to the replica that runs it ("last served"), so a conversation follows its
cache when load moves it. The load of a replica is the number of turns this table routed to it that have not finished.

``mode="round_robin"`` (for comparison) is the rule of Ray Serve's own ``RoundRobinRouter``
(``ray.serve.experimental.round_robin_router``) and of SGLang's router's ``round_robin`` policy: one cursor, advanced
by one for every turn in the order turns reach the router; the turn goes to the replica at the cursor. The cursor
starts at a random position (as Ray's does; SGLang's starts at 0). Nothing else is looked at: not the session or
conversation that sent the turn, not its prefix, not load (if the chosen replica is full, Ray Serve tries the next
ones in the rotation, ``Decision.ranked``).

Thread-safe: Ray Serve's router may run on its own event loop thread while the ingress reads the table.
"""

from __future__ import annotations

import enum
import itertools
import random
import threading
from collections import Counter, OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field

from chat.cluster.settings import RouterMode

MAX_PREFIX_BLOCKS = 200_000  # block digests remembered (least recently routed dropped first): ~30 MB
MAX_PINNED_SESSIONS = 100_000  # session pins remembered (least recently used dropped first)
ROUND_ROBIN_START = 2**31  # the round-robin cursor starts below this (at random, as in Ray Serve's RoundRobinRouter)


class Rule(enum.StrEnum):
    """Why a turn went where it went (the ``rule`` label of ``turncache_cluster_routed_total``)."""

    SESSION = "session"  # the session's pinned replica
    PREFIX = "prefix"  # the replica that last served the longest digest
    LEAST_LOADED = "least_loaded"  # no usable prefix, or the preferred replica was over the threshold
    ROUND_ROBIN = "round_robin"  # --router round_robin


@dataclass(frozen=True, slots=True)
class SessionRef:
    """The WebSocket session a turn belongs to."""

    id: str  # the session id
    first_turn: bool = False  # nothing answered in it yet


@dataclass(frozen=True, slots=True)
class RouteKey:
    """What the router reads from a turn."""

    call_id: str  # unique per turn sent to a replica (the table's handle on it until `finished`)
    session: SessionRef | None = None  # None for stateless turns
    digests: tuple[int, ...] = ()  # block digests of the rendered prompt (chat.cluster.prompt_keys)


@dataclass(frozen=True, slots=True)
class RoutingPolicy:
    mode: RouterMode = "prefix"
    imbalance: int = 4  # turns the preferred replica may run beyond the least-loaded one (rule 2)
    max_prefix_blocks: int = MAX_PREFIX_BLOCKS
    max_pinned_sessions: int = MAX_PINNED_SESSIONS


@dataclass(frozen=True, slots=True)
class Decision:
    replica: str  # where the turn goes
    rule: Rule  # why
    matched_blocks: int  # digests of the turn known at `replica` (rule prefix), else 0
    ranked: tuple[str, ...]  # `replica` first, then the others (by load; round robin: in rotation): tried in order


@dataclass(slots=True)
class _Assignment:
    replica: str  # the replica the turn was sent to
    rule: Rule  # why it was chosen
    key: RouteKey  # its key, to move pins and digests if Ray Serve sent it elsewhere


@dataclass(frozen=True, slots=True)
class ReplicaView:
    """One replica in :meth:`RoutingTable.snapshot`."""

    replica: str
    inflight: int  # turns routed here and not finished
    pinned_sessions: int
    prefix_blocks: int  # digests whose last server is this replica
    routed: dict[str, int] = field(default_factory=dict)  # turns routed here by rule


class RoutingTable:
    """Session pins, the prefix map and in-flight turns, for one engine deployment.

    The caller must report every chosen turn's end with :meth:`finished` (exactly once is enough; more is harmless).
    """

    def __init__(self, policy: RoutingPolicy | None = None) -> None:
        self.policy = policy or RoutingPolicy()
        self._lock = threading.Lock()  # every method holds it
        self._live: tuple[str, ...] = ()  # replicas Ray Serve reports running, sorted
        self._lost: set[str] = set()  # replicas a turn saw die; never chosen again
        self._inflight: Counter[str] = Counter()  # turns routed and not finished, per replica
        self._assigned: dict[str, _Assignment] = {}  # call_id -> where the turn went
        self._pins: OrderedDict[str, str] = OrderedDict()  # session id -> replica, least recently used first
        self._pin_counts: Counter[str] = Counter()  # pinned sessions per replica
        self._blocks: OrderedDict[int, str] = OrderedDict()  # digest -> replica that last served it, LRU first
        self._routed: Counter[tuple[str, Rule]] = Counter()  # (replica, rule) -> turns, since start
        self._tiebreak = itertools.count()  # rotates ties of the least-loaded rule
        self._cursor = random.randrange(ROUND_ROBIN_START)  # round robin: the next turn's place in the rotation

    # ---------------------------------------------------------------- routing

    def choose(self, key: RouteKey, candidates: Sequence[str]) -> Decision | None:
        """Route one turn among ``candidates`` (the replicas Ray Serve can send to); record it as in flight there.

        Choosing again for the same ``key.call_id`` (Ray Serve retries) replaces the earlier choice. Returns None
        when there is no candidate: the caller must wait for replicas.
        """
        with self._lock:
            usable = [r for r in sorted(set(candidates)) if r not in self._lost]
            if not usable:
                return None
            self._release(key.call_id)
            decision = self._decide(key, usable)
            self._assign(key, decision.replica, decision.rule)
            return decision

    def routed(self, call_id: str, replica: str) -> None:
        """Ray Serve sent the turn to ``replica``: move its accounting there if that was not the first choice."""
        with self._lock:
            assignment = self._assigned.get(call_id)
            if assignment is None or assignment.replica == replica:
                return
            self._release(call_id)
            self._routed[(assignment.replica, assignment.rule)] -= 1
            self._assign(assignment.key, replica, assignment.rule)

    def finished(self, call_id: str) -> None:
        """The turn is over (done, failed, cancelled, or never sent)."""
        with self._lock:
            self._release(call_id)

    # ---------------------------------------------------------------- replicas

    def replicas_changed(self, live: Sequence[str]) -> None:
        """Ray Serve's current replicas: pins and digests of replicas no longer running are dropped."""
        with self._lock:
            self._live = tuple(sorted(set(live)))
            self._forget(lambda r: r not in self._live)

    def replica_lost(self, replica: str) -> None:
        """A turn saw ``replica`` die: never choose it again; its sessions will be pinned anew."""
        with self._lock:
            self._lost.add(replica)
            self._forget(lambda r: r == replica)

    def live(self) -> tuple[str, ...]:
        """Replicas that can take turns."""
        with self._lock:
            return tuple(r for r in self._live if r not in self._lost)

    def inflight(self) -> int:
        """Turns in progress over all replicas."""
        with self._lock:
            return sum(self._inflight.values())

    def load(self, replica: str) -> int:
        """Turns in progress on ``replica``."""
        with self._lock:
            return self._inflight[replica]

    def pinned(self, session_id: str) -> str | None:
        with self._lock:
            return self._pins.get(session_id)

    def snapshot(self) -> list[ReplicaView]:
        """Every live replica's load and holdings, sorted by replica id."""
        with self._lock:
            blocks = Counter(self._blocks.values())
            views = []
            for r in self._live:
                if r in self._lost:
                    continue
                routed = {rule.value: n for (rep, rule), n in self._routed.items() if rep == r and n}
                views.append(ReplicaView(r, self._inflight[r], self._pin_counts[r], blocks[r], routed))
            return views

    # ---------------------------------------------------------------- internals (lock held)

    def _decide(self, key: RouteKey, usable: list[str]) -> Decision:
        if self.policy.mode == "round_robin":  # the key is not read: only the order of arrival counts
            start, n = self._cursor % len(usable), len(usable)
            self._cursor += 1
            ranked = tuple(usable[(start + k) % n] for k in range(n))  # if full, the next ones in the rotation
            return Decision(ranked[0], Rule.ROUND_ROBIN, 0, ranked)
        session = key.session
        pinned = self._pins.get(session.id) if session is not None else None
        if pinned in usable:
            return Decision(pinned, Rule.SESSION, 0, self._ranked(pinned, usable))
        least = self._least_loaded(usable)
        preferred, matched = (None, 0) if session and session.first_turn else self._longest_match(key.digests, usable)
        if preferred is not None and self._inflight[preferred] - self._inflight[least] <= self.policy.imbalance:
            return Decision(preferred, Rule.PREFIX, matched, self._ranked(preferred, usable))
        return Decision(least, Rule.LEAST_LOADED, 0, self._ranked(least, usable))

    def _least_loaded(self, usable: list[str]) -> str:
        turn = next(self._tiebreak)
        order = {r: (i - turn) % len(usable) for i, r in enumerate(usable)}  # rotating tie-break
        return min(usable, key=lambda r: (self._inflight[r], self._pin_counts[r], order[r]))

    def _longest_match(self, digests: tuple[int, ...], usable: list[str]) -> tuple[str | None, int]:
        for i in range(len(digests) - 1, -1, -1):
            replica = self._blocks.get(digests[i])
            if replica is not None and replica in usable:
                return replica, i + 1
        return None, 0

    def _ranked(self, first: str, usable: list[str]) -> tuple[str, ...]:
        rest = sorted((r for r in usable if r != first), key=lambda r: (self._inflight[r], r))
        return (first, *rest)

    def _assign(self, key: RouteKey, replica: str, rule: Rule) -> None:
        self._assigned[key.call_id] = _Assignment(replica, rule, key)
        self._inflight[replica] += 1
        self._routed[(replica, rule)] += 1
        if self.policy.mode == "round_robin":
            return
        if key.session is not None:
            self._pin(key.session.id, replica)
        for digest in key.digests:
            self._blocks[digest] = replica
            self._blocks.move_to_end(digest)
        while len(self._blocks) > self.policy.max_prefix_blocks:
            self._blocks.popitem(last=False)

    def _release(self, call_id: str) -> None:
        assignment = self._assigned.pop(call_id, None)
        if assignment is not None:
            self._inflight[assignment.replica] -= 1
            if self._inflight[assignment.replica] <= 0:
                del self._inflight[assignment.replica]

    def _pin(self, session_id: str, replica: str) -> None:
        self._unpin(session_id)
        self._pins[session_id] = replica
        self._pin_counts[replica] += 1
        while len(self._pins) > self.policy.max_pinned_sessions:
            self._unpin(next(iter(self._pins)))

    def _unpin(self, session_id: str) -> None:
        replica = self._pins.pop(session_id, None)
        if replica is not None:
            self._pin_counts[replica] -= 1
            if self._pin_counts[replica] <= 0:
                del self._pin_counts[replica]

    def _forget(self, gone) -> None:
        for session_id in [s for s, r in self._pins.items() if gone(r)]:
            self._unpin(session_id)
        for digest in [d for d, r in self._blocks.items() if gone(r)]:
            del self._blocks[digest]


_TABLES: dict[str, RoutingTable] = {}
_TABLES_LOCK = threading.Lock()


def table_for(name: str, policy: RoutingPolicy | None = None) -> RoutingTable:
    """The process's table for the engine deployment ``name`` (created on first use).

    Ray Serve builds the router inside the process that holds the deployment's handle (the ingress); the router and
    the ingress meet here. ``policy`` is used when the table is created.
    """
    with _TABLES_LOCK:
        table = _TABLES.get(name)
        if table is None:
            table = _TABLES[name] = RoutingTable(policy)
        return table
