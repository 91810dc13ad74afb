"""Which replica runs a turn: the routing rule, over a table of what each replica runs. Pure: no Ray.

The rule (``mode="prefix"``) is a placement every ingress computes alike, without asking the others: rendezvous
(highest-random-weight) hashing of the turn's **placement key** over the live replicas, moved off its replica only
by load.

- The placement key of a WebSocket session turn is its session id; of a stateless turn (``/v1/chat/completions``,
  ``completion.create``), the block digest that covers its conversation's opening (``chat.cluster.prompt_keys``):
  every later turn of that conversation renders to the same opening, so it has the same key.
- Every replica gets a weight per key (a 64-bit hash of the key and the replica's id); the replicas ranked by
  weight are the key's **order**, its first the key's **home**. Each key's order depends only on the key and the set
  of replicas: when a replica joins, only the keys whose new home it is move (to it); when one leaves, only its own
  keys move, each to the next replica of its order. A replica that leaves and comes back gets its keys back.
- **load**: the turn goes to the first replica of its order that runs at most ``imbalance`` turns more than the
  least-loaded replica (rule ``session`` or ``prefix`` when that is the home, ``least_loaded`` when load moved it).
  Loads are the replicas' own queue lengths, as Ray Serve's router probes them (every ingress sees the same ones);
  where a replica did not answer, this table's count of the turns it routed there and that have not finished.
- A turn with no key (a stateless prompt shorter than one block) goes to the least-loaded replica (ties in rotation).

The table also records, for ``/metrics``, where each session and each block digest was last routed.

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
import hashlib
import itertools
import random
import threading
from collections import Counter, OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from chat.cluster.settings import RouterMode

MAX_PREFIX_BLOCKS = 200_000  # block digests remembered (least recently routed dropped first): ~30 MB
MAX_PINNED_SESSIONS = 100_000  # session pins remembered (least recently used dropped first)
ROUND_ROBIN_START = 2**31  # the round-robin cursor starts below this (at random, as in Ray Serve's RoundRobinRouter)


class Rule(enum.StrEnum):
    """Why a turn went where it went (the ``rule`` label of ``turncache_cluster_routed_total``)."""

    SESSION = "session"  # the home of the session id
    PREFIX = "prefix"  # the home of the conversation's opening digest
    LEAST_LOADED = "least_loaded"  # no key, or the home (and the next ones of its order) over the threshold
    ROUND_ROBIN = "round_robin"  # --router round_robin


@dataclass(frozen=True, slots=True)
class SessionRef:
    """The WebSocket session a turn belongs to."""

    id: str  # the session id


@dataclass(frozen=True, slots=True)
class RouteKey:
    """What the router reads from a turn."""

    call_id: str  # unique per turn sent to a replica (the table's handle on it until `finished`)
    session: SessionRef | None = None  # None for stateless turns
    digests: tuple[int, ...] = ()  # block digests of the rendered prompt (chat.cluster.prompt_keys)
    opening: int | None = None  # the digest covering the conversation's opening (stateless turns); None: none

    @property
    def placement(self) -> str | None:
        """What rendezvous hashing places: the session id, else the opening's digest; None: load alone."""
        if self.session is not None:
            return "session:" + self.session.id
        return None if self.opening is None else f"prefix:{self.opening:016x}"


@dataclass(frozen=True, slots=True)
class RoutingPolicy:
    mode: RouterMode = "prefix"
    imbalance: int = 4  # turns a key's replica may run beyond the least-loaded one
    max_prefix_blocks: int = MAX_PREFIX_BLOCKS
    max_pinned_sessions: int = MAX_PINNED_SESSIONS


@dataclass(frozen=True, slots=True)
class Decision:
    replica: str  # where the turn goes
    rule: Rule  # why
    ranked: tuple[str, ...]  # `replica` first, then the others (the key's order; round robin: the rotation)


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
    pinned_sessions: int  # sessions whose last turn was routed here
    prefix_blocks: int  # digests whose last turn was routed here
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

    def choose(
        self, key: RouteKey, candidates: Sequence[str], queue_lengths: Mapping[str, int] | None = None
    ) -> Decision | None:
        """Route one turn among ``candidates`` (the replicas Ray Serve can send to); record it as in flight there.

        ``queue_lengths``: the replicas' own counts of turns they run (Ray Serve's probes); a replica missing from it
        counts the turns this table routed there. Choosing again for the same ``key.call_id`` (Ray Serve retries)
        replaces the earlier choice. Returns None when there is no candidate: the caller must wait for replicas.
        """
        with self._lock:
            usable = [r for r in sorted(set(candidates)) if r not in self._lost]
            if not usable:
                return None
            self._release(key.call_id)
            loads = {r: (queue_lengths or {}).get(r, self._inflight[r]) for r in usable}
            decision = self._decide(key, usable, loads)
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

    def assigned(self, call_id: str) -> str | None:
        """The replica an unfinished turn was routed to."""
        with self._lock:
            found = self._assigned.get(call_id)
            return found.replica if found is not None else None

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
        """Where the session's last turn was routed (None: not known here)."""
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

    def _decide(self, key: RouteKey, usable: list[str], loads: Mapping[str, int]) -> Decision:
        if self.policy.mode == "round_robin":  # the key is not read: only the order of arrival counts
            start, n = self._cursor % len(usable), len(usable)
            self._cursor += 1
            ranked = tuple(usable[(start + k) % n] for k in range(n))  # if full, the next ones in the rotation
            return Decision(ranked[0], Rule.ROUND_ROBIN, ranked)
        placement = key.placement
        if placement is None:
            turn = next(self._tiebreak)
            rotation = {r: (i - turn) % len(usable) for i, r in enumerate(usable)}  # rotating tie-break
            ranked = tuple(sorted(usable, key=lambda r: (loads[r], rotation[r])))
            return Decision(ranked[0], Rule.LEAST_LOADED, ranked)
        order = rendezvous(placement, usable)
        least = min(loads.values())
        chosen = next(r for r in order if loads[r] - least <= self.policy.imbalance)  # the least loaded one qualifies
        rule = (Rule.SESSION if key.session is not None else Rule.PREFIX) if chosen == order[0] else Rule.LEAST_LOADED
        return Decision(chosen, rule, (chosen, *(r for r in order if r != chosen)))

    def _assign(self, key: RouteKey, replica: str, rule: Rule) -> None:
        self._assigned[key.call_id] = _Assignment(replica, rule, key)
        self._inflight[replica] += 1
        self._routed[(replica, rule)] += 1
        if self.policy.mode == "round_robin":
            return
        if key.session is not None:  # recorded for /metrics only: placement is by hash
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


def weight(placement: str, replica: str) -> int:
    """The rendezvous weight of ``replica`` for ``placement``: a 64-bit hash of both (the same in every process)."""
    digest = hashlib.blake2b(placement.encode() + b"\0" + replica.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


def rendezvous(placement: str, replicas: Sequence[str]) -> list[str]:
    """``replicas`` by decreasing weight for ``placement``: the first is its home, the next ones its fallbacks."""
    return sorted(replicas, key=lambda r: (-weight(placement, r), r))


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
