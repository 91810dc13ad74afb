"""A radix tree over index keys that finds the longest servable prefix in time that grows with the query.

The tree knows nothing of tensors. For every entry it is told:

- its keys (tokens, with media positions re-keyed: see :mod:`cache.media`);
- what lengths it can serve: either an *interval* ``[lo, T]`` (entries without recurrent layers: every length
  from ``lo`` up to its own length ``T``), or a set of *points* (entries with recurrent layers: exactly the
  snapshot lengths);
- its recency (a counter that grows with every use).

Layout. A node's ``edge`` holds the keys from its parent's depth to its own ``depth``. Nodes exist where an entry
ends, where an entry has a point, and where paths branch; a node with none of these is merged away.

Per node we keep:

- ``ending``: entries whose sequence ends exactly here;
- ``points``: entries with a servable point exactly at this depth, least to most recently used;
- ``frontier``: over the *interval* entries of the whole subtree, the Pareto set of (smallest ``lo``, most recent);
  sorted by ``lo`` ascending, which makes recency ascending too. The most recent entry able to serve a length ``p``
  is the last frontier item with ``lo <= p``.

Lookup walks down the query's keys, then scans the walked edges from the deepest up. Positions in the range
``(start, reached]`` of an edge are passed by exactly the entries of that edge's subtree, so the deepest servable
length in that range is ``floor(reached)`` (the largest length not strictly inside a media span) if some frontier
item has ``lo <= floor(reached)``, or the node's depth if the node has points there. The first range, from the
bottom, that yields a length gives the answer; ties between entries go to the most recently used.
"""

from __future__ import annotations

from array import array
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

EntryId = int


class _Node:
    __slots__ = ("children", "depth", "edge", "ending", "frontier", "parent", "points")

    def __init__(self, edge: array, depth: int, parent: _Node | None) -> None:
        self.edge = edge  # keys from the parent's depth up to this node's depth
        self.depth = depth  # number of keys from the root to the end of this node
        self.parent = parent  # None only for the root
        self.children: dict[int, _Node] = {}  # first key of the child's edge -> child
        self.ending: dict[EntryId, None] = {}  # entries whose sequence ends here
        self.points: dict[EntryId, None] = {}  # entries servable exactly here, least -> most recently used
        self.frontier: list[tuple[int, int, EntryId]] = []  # (lo, recency, entry) Pareto set, lo ascending


@dataclass(slots=True)
class _Record:
    end: _Node  # node where the entry's sequence ends
    lo: int | None  # interval entries: shortest servable length; None for point entries
    points: tuple[int, ...]  # point entries: servable lengths, ascending
    recency: int  # larger = used more recently
    point_nodes: list[_Node] = field(default_factory=list)  # nodes holding this entry's points


def shared_prefix_length(a: Sequence[int], b: Sequence[int]) -> int:
    """How many leading tokens two token sequences share (what a cache keyed by one serves of the other)."""
    n = min(len(a), len(b))
    return _common_prefix(_keys(a), _keys(b), 0, n) if n else 0


def _keys(tokens: Sequence[int]) -> array:
    """``tokens`` as the index's key array: itself when it is one already (no copy)."""
    return tokens if isinstance(tokens, array) and tokens.typecode == "q" else array("q", tokens)


def _common_prefix(edge: array, keys: array, offset: int, n: int) -> int:
    """How many of the first ``n`` keys of ``edge`` equal ``keys[offset:]``, by bisection over C slice compares."""
    if edge[:n] == keys[offset : offset + n]:
        return n
    lo, hi = 0, n - 1  # the first mismatch lies in [lo, hi]
    while lo < hi:
        mid = (lo + hi) // 2
        if edge[lo : mid + 1] == keys[offset + lo : offset + mid + 1]:
            lo = mid + 1
        else:
            hi = mid
    return lo


class RadixIndex:
    """The index of one namespace. Single-threaded; the caller serialises access."""

    def __init__(self) -> None:
        self._root = _Node(array("q"), 0, None)  # depth 0; never removed; holds no entries
        self._records: dict[EntryId, _Record] = {}  # every indexed entry

    # ---------------------------------------------------------------- public API

    def __len__(self) -> int:
        return len(self._records)

    def __contains__(self, eid: EntryId) -> bool:
        return eid in self._records

    def add(self, eid: EntryId, keys: array, lo: int | None, points: tuple[int, ...], recency: int) -> None:
        """Index entry ``eid``. Give ``lo`` for an interval entry or ``points`` (non-empty) for a point entry.

        ``recency`` must be larger than that of every indexed entry.
        """
        assert eid not in self._records
        assert (lo is None) != (not points)
        end = self._node_at(keys, len(keys))
        record = _Record(end, lo, tuple(sorted(points)), recency)
        self._records[eid] = record
        end.ending[eid] = None
        for p in record.points:
            node = self._node_at(keys, p)
            node.points[eid] = None
            record.point_nodes.append(node)
        if lo is not None:
            self._push_frontier(end, lo, recency, eid)

    def remove(self, eid: EntryId) -> None:
        """Drop entry ``eid`` from the index and prune the nodes it alone kept."""
        record = self._records.pop(eid)
        del record.end.ending[eid]
        for node in record.point_nodes:
            del node.points[eid]
        if record.lo is not None:
            node: _Node | None = record.end
            while node is not None:
                if any(item[2] == eid for item in node.frontier):
                    self._recompute_frontier(node)
                node = node.parent
        self._prune_path(record.end)  # point nodes are ancestors of the end node

    def touch(self, eid: EntryId, recency: int) -> None:
        """Mark ``eid`` as the most recently used entry (``recency`` larger than every other)."""
        record = self._records[eid]
        record.recency = recency
        for node in record.point_nodes:
            del node.points[eid]
            node.points[eid] = None
        if record.lo is not None:
            self._push_frontier(record.end, record.lo, recency, eid)

    def best(self, keys: array, limit: int, floor: Callable[[int], int]) -> tuple[int, EntryId] | None:
        """The longest length ``n <= limit`` that some entry serves for ``keys``, and that entry.

        ``floor(p)`` must return the largest length ``<= p`` that is not strictly inside a media span of the
        query. Among entries serving the same length the most recently used wins. No side effects.
        """
        node, depth = self._root, 0
        walked: list[tuple[_Node, int, int]] = []  # (node, depth where its edge starts, depth reached on it)
        while depth < limit:
            child = node.children.get(keys[depth])
            if child is None:
                break
            take = min(len(child.edge), limit - depth)
            matched = _common_prefix(child.edge, keys, depth, take)
            walked.append((child, depth, depth + matched))
            if matched < len(child.edge):
                break
            node, depth = child, child.depth
        for child, start, reached in reversed(walked):
            found: tuple[int, int, EntryId] | None = None  # (length, recency, entry)
            if reached == child.depth and child.points and floor(reached) == reached:
                eid = next(reversed(child.points))
                found = (reached, self._records[eid].recency, eid)
            if child.frontier:
                p = floor(reached)
                if p > start and child.frontier[0][0] <= p:
                    _lo, recency, eid = next(item for item in reversed(child.frontier) if item[0] <= p)
                    if found is None or (p, recency) > found[:2]:
                        found = (p, recency, eid)
            if found is not None:
                return found[0], found[2]
        return None

    def reach(self, keys: array) -> tuple[int, bool]:
        """How far ``keys`` follow some indexed sequence (the longest common prefix with any entry, servable or
        not), and whether some entry goes on past that point with another key (False: every sequence on the path
        ends there). No side effects."""
        node, depth = self._root, 0
        while depth < len(keys):
            child = node.children.get(keys[depth])
            if child is None:
                return depth, bool(node.children)
            take = min(len(child.edge), len(keys) - depth)
            matched = _common_prefix(child.edge, keys, depth, take)
            if matched < len(child.edge):
                return depth + matched, depth + matched < len(keys)
            node, depth = child, child.depth
        return depth, False

    def servable(self, eid: EntryId, n: int) -> bool:
        """Whether entry ``eid`` (by its own rules, media aside) can serve length ``n``."""
        record = self._records[eid]
        if record.lo is not None:
            return record.lo <= n <= record.end.depth
        return n in record.points

    def entries_on_path(self, eid: EntryId) -> Iterator[EntryId]:
        """Other entries whose sequence is a prefix of ``eid``'s (or equal to it)."""
        node: _Node | None = self._records[eid].end
        while node is not None:
            for other in node.ending:
                if other != eid:
                    yield other
            node = node.parent

    def covers(self, big: EntryId, small: EntryId, floor: Callable[[int], int]) -> bool:
        """Whether entry ``big`` serves every length that ``small`` serves, ``small`` lying on ``big``'s path.

        ``floor`` is the span floor of the shared media (lengths inside a span are served by neither).
        """
        s = self._records[small]
        return self._covers(self._records[big], s.lo, s.points, s.end.depth, floor)

    def covered_by_other(self, eid: EntryId, floor: Callable[[int], int]) -> bool:
        """Whether another entry serves every length that ``eid`` serves (``floor``: the span floor of ``eid``'s
        media). Walks the subtree below ``eid``'s end: the entries whose paths pass through it."""
        record = self._records[eid]
        stack = [record.end]
        while stack:
            node = stack.pop()
            for other in node.ending:
                if other != eid and self._covers(
                    self._records[other], record.lo, record.points, record.end.depth, floor
                ):
                    return True
            stack.extend(node.children.values())
        return False

    def covering(
        self, keys: array, lo: int | None, points: tuple[int, ...], floor: Callable[[int], int]
    ) -> EntryId | None:
        """An indexed entry that passes through the end of ``keys`` and serves every length that an entry with
        these keys and this ``lo`` / ``points`` would serve; the most recently used such entry, or None.

        Point entries always have a point at their own length, so their candidates are the points there.
        """
        length = len(keys)
        node, depth = self._root, 0
        while depth < length:  # find the node whose edge holds position `length`
            child = node.children.get(keys[depth])
            if child is None:
                return None
            take = min(len(child.edge), length - depth)
            if _common_prefix(child.edge, keys, depth, take) < take:
                return None
            node, depth = child, depth + take
        if lo is not None:
            candidates = [item[2] for item in reversed(node.frontier)]
        elif node.depth == length:
            candidates = list(reversed(node.points))
        else:
            return None
        for other in candidates:
            if self._covers(self._records[other], lo, points, length, floor):
                return other
        return None

    def path_keys(self, eid: EntryId) -> array:
        """The keys from the root to ``eid``'s end (for invariant checks)."""
        edges = []
        node: _Node | None = self._records[eid].end
        while node is not None:
            edges.append(node.edge)
            node = node.parent
        out = array("q")
        for edge in reversed(edges):
            out.extend(edge)
        return out

    def recency_of(self, eid: EntryId) -> int:
        return self._records[eid].recency

    # ---------------------------------------------------------------- invariants

    def check(self) -> None:
        """Raise AssertionError if the tree and the records disagree."""
        seen_ending: set[EntryId] = set()
        seen_points: dict[EntryId, int] = {}
        stack = [self._root]
        assert not self._root.ending and not self._root.points and self._root.depth == 0
        while stack:
            node = stack.pop()
            for first, child in node.children.items():
                assert child.parent is node, "child's parent link is wrong"
                assert len(child.edge) > 0 and child.edge[0] == first, "child keyed by the wrong first key"
                assert child.depth == node.depth + len(child.edge), "depth does not add up"
                stack.append(child)
            if node is not self._root:
                assert node.ending or node.points or len(node.children) != 1, "unmerged pass-through node"
            for eid in node.ending:
                assert self._records[eid].end is node
                seen_ending.add(eid)
            for eid in node.points:
                assert node in self._records[eid].point_nodes
                seen_points[eid] = seen_points.get(eid, 0) + 1
            assert node.frontier == self._expected_frontier(node), "stale frontier"
            recencies = [self._records[eid].recency for eid in node.points]
            assert recencies == sorted(recencies), "points out of recency order"
        assert seen_ending == set(self._records), "ending sets and records disagree"
        for eid, record in self._records.items():
            assert seen_points.get(eid, 0) == len(record.points)
            assert [n.depth for n in record.point_nodes] == list(record.points)
            assert (record.lo is None) != (not record.points)

    # ---------------------------------------------------------------- helpers

    @staticmethod
    def _covers(
        big: _Record, lo: int | None, points: tuple[int, ...], length: int, floor: Callable[[int], int]
    ) -> bool:
        """Whether ``big`` serves every length served by an entry of ``length`` with ``lo`` / ``points``."""
        if length > big.end.depth:
            return False
        if lo is not None:
            wanted: Iterator[int] = (n for n in range(max(lo, 1), length + 1) if floor(n) == n)
        else:
            wanted = iter(points)
        if big.lo is not None:
            if lo is not None and big.lo <= max(lo, 1):
                return True
            return all(big.lo <= n for n in wanted)
        have = set(big.points)
        return all(n in have for n in wanted)

    def _node_at(self, keys: array, n: int) -> _Node:
        """The node at depth ``n`` on the path of ``keys[:n]``, creating and splitting nodes as needed."""
        node, depth = self._root, 0
        while depth < n:
            child = node.children.get(keys[depth])
            if child is None:
                leaf = _Node(keys[depth:n], n, node)
                node.children[keys[depth]] = leaf
                return leaf
            take = min(len(child.edge), n - depth)
            matched = _common_prefix(child.edge, keys, depth, take)
            if matched < len(child.edge):
                child = self._split(child, matched)
            node, depth = child, child.depth
        return node

    def _split(self, child: _Node, at: int) -> _Node:
        """Cut ``child``'s edge after ``at`` keys; return the new node in between."""
        parent = child.parent
        assert parent is not None and 0 < at < len(child.edge)
        mid = _Node(child.edge[:at], parent.depth + at, parent)
        parent.children[child.edge[0]] = mid
        child.edge = child.edge[at:]
        child.parent = mid
        mid.children[child.edge[0]] = child
        mid.frontier = list(child.frontier)
        return mid

    def _push_frontier(self, node: _Node | None, lo: int, recency: int, eid: EntryId) -> None:
        """Add the newest interval entry to the frontiers from ``node`` up to the root."""
        while node is not None:
            kept = [item for item in node.frontier if item[0] < lo and item[2] != eid]
            kept.append((lo, recency, eid))
            node.frontier = kept
            node = node.parent

    def _expected_frontier(self, node: _Node) -> list[tuple[int, int, EntryId]]:
        items = [
            (self._records[eid].lo, self._records[eid].recency, eid)
            for eid in node.ending
            if self._records[eid].lo is not None
        ]
        for child in node.children.values():
            items.extend(child.frontier)
        items.sort(key=lambda item: (item[0], -item[1]))
        out: list[tuple[int, int, EntryId]] = []
        for item in items:
            if not out or item[1] > out[-1][1]:
                out.append(item)  # type: ignore[arg-type]
        return out  # type: ignore[return-value]

    def _recompute_frontier(self, node: _Node) -> None:
        node.frontier = self._expected_frontier(node)

    def _prune_path(self, node: _Node) -> None:
        """Delete nodes that hold nothing and merge pass-through nodes, from ``node`` up to the root."""
        while node is not self._root:
            parent = node.parent
            assert parent is not None
            if not node.ending and not node.points:
                if not node.children:
                    del parent.children[node.edge[0]]
                elif len(node.children) == 1:
                    (child,) = node.children.values()
                    child.edge = node.edge + child.edge
                    child.parent = parent
                    parent.children[child.edge[0]] = child
            node = parent
