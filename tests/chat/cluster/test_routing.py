"""The routing rule over a RoutingTable: no Ray, replicas are names."""

import hashlib
import itertools

from hypothesis import given, settings
from hypothesis import strategies as st

from chat.cluster.routing import RouteKey, RoutingPolicy, RoutingTable, Rule, SessionRef, rendezvous

ids = itertools.count()


def key(session=None, digests=(), opening=None):
    ref = SessionRef(session) if session is not None else None
    return RouteKey(f"call-{next(ids)}", ref, tuple(digests), opening)


def table(mode="prefix", imbalance=4, replicas=("a", "b"), **policy):
    t = RoutingTable(RoutingPolicy(mode=mode, imbalance=imbalance, **policy))
    t.replicas_changed(replicas)
    return t


def reference_home(placement: str, replicas) -> str:
    """Rendezvous hashing as its definition says: the replica of highest weight, the weight a 64-bit hash of the key
    and the replica (written independently of chat.cluster.routing)."""
    best, best_weight = None, -1
    for replica in replicas:
        h = hashlib.blake2b(digest_size=8)
        h.update(placement.encode())
        h.update(b"\0")
        h.update(replica.encode())
        w = int.from_bytes(h.digest(), "big")
        if w > best_weight or (w == best_weight and replica < best):
            best, best_weight = replica, w
    return best


def test_a_session_goes_to_the_home_of_its_id_and_stays_there_under_load_within_the_threshold():
    t = table(imbalance=2, replicas=("a", "b", "c"))
    home = reference_home("session:s1", "abc")
    for _ in range(3):  # its own turns pile up on home (3 - 0 > 2 only after the third)
        decision = t.choose(key("s1"), ["a", "b", "c"])
        assert (decision.replica, decision.rule) == (home, Rule.SESSION)
    moved = t.choose(key("s1"), ["a", "b", "c"])  # home runs 3, the others 0: load moves it
    assert moved.rule is Rule.LEAST_LOADED and moved.replica == rendezvous("session:s1", "abc")[1]
    assert moved.ranked[0] == moved.replica and sorted(moved.ranked) == ["a", "b", "c"]


def test_every_ingress_places_every_key_alike_from_the_replicas_queue_lengths():
    """Two tables (two ingresses) that routed different turns themselves agree, given the replicas' own loads."""
    one, two = table(imbalance=1, replicas="abcd"), table(imbalance=1, replicas="abcd")
    for i in range(6):  # only `one` routed these: its own counts differ from `two`'s
        one.choose(key(opening=1000 + i), "abcd")
    lengths = {"a": 3, "b": 0, "c": 1, "d": 2}
    for i in range(50):
        k = f"s{i}"
        a = one.choose(key(k), "abcd", lengths)
        b = two.choose(key(k), "abcd", lengths)
        assert (a.replica, a.rule, a.ranked) == (b.replica, b.rule, b.ranked)
        first_ok = next(r for r in rendezvous("session:" + k, "abcd") if lengths[r] - 0 <= 1)
        assert a.replica == first_ok


def test_a_stateless_conversation_keeps_its_replica_by_its_opening_and_conversations_spread():
    t = table(imbalance=100, replicas=("a", "b", "c"))
    turns = [t.choose(key(digests=[1, 2, 3 + n], opening=2), "abc") for n in range(4)]
    assert {d.replica for d in turns} == {reference_home("prefix:0000000000000002", "abc")}
    assert all(d.rule is Rule.PREFIX for d in turns)
    homes = {t.choose(key(opening=o), "abc").replica for o in range(40)}  # 40 conversations: all replicas used
    assert homes == {"a", "b", "c"}


def test_a_turn_without_a_key_goes_to_the_least_loaded_replica():
    t = table()
    decision = t.choose(key(), ["a", "b"], {"a": 5, "b": 1})
    assert (decision.replica, decision.rule, decision.ranked) == ("b", Rule.LEAST_LOADED, ("b", "a"))


def test_the_replicas_queue_lengths_override_the_tables_own_counts():
    t = table(imbalance=2)
    home = reference_home("session:s", "ab")
    other = "b" if home == "a" else "a"
    assert t.choose(key("s"), "ab", {home: 3, other: 0}).replica == other  # 3 - 0 > 2, whatever this table counted
    assert t.choose(key("s"), "ab", {home: 2, other: 0}).replica == home  # at the threshold: it stays
    assert t.choose(key("s"), "ab", {other: 0}).replica == home  # home did not answer: this table's count (2) stands


def test_finished_turns_release_their_load():
    t = table(imbalance=0)
    k = key(opening=3)
    home = t.choose(k, ["a", "b"]).replica
    assert t.load(home) == 1 and t.inflight() == 1
    t.finished(k.call_id)
    t.finished(k.call_id)  # twice is harmless
    assert t.load(home) == 0 and t.inflight() == 0
    assert t.choose(key(opening=3), ["a", "b"]).replica == home  # 0 - 0 <= 0: its home again


def test_choosing_again_for_the_same_call_replaces_the_first_choice():
    t = table()
    k = key(opening=5)
    t.choose(k, ["a", "b"])
    t.choose(k, ["a", "b"])  # Ray Serve retried the routing of this call
    assert t.inflight() == 1


def test_routed_elsewhere_moves_the_load_and_the_record():
    t = table(imbalance=100)
    k = key("s", digests=[1, 2])
    first = t.choose(k, ["a", "b"]).replica
    other = "b" if first == "a" else "a"
    t.routed(k.call_id, other)  # the first choice was full; Ray Serve took the next rank
    assert (t.load(first), t.load(other), t.pinned("s")) == (0, 1, other)


def test_round_robin_ignores_sessions_and_prefixes():
    t = table(mode="round_robin")
    chosen = [t.choose(key("s", digests=[1, 2]), ["a", "b"]) for _ in range(4)]
    assert [d.replica for d in chosen] in (["a", "b", "a", "b"], ["b", "a", "b", "a"])
    assert all(d.rule is Rule.ROUND_ROBIN for d in chosen)
    assert t.pinned("s") is None


def test_round_robin_rotates_per_turn_in_arrival_order_whoever_sent_it_and_whatever_the_load():
    """Ray Serve's RoundRobinRouter: one cursor for every request; sessions, prefixes and load play no part."""
    t = table(mode="round_robin", replicas=("a", "b", "c"))
    senders = [key("s1", [1]), key(), key("s1", [1, 2]), key("s2"), key(digests=[1, 2, 3]), key("s1"), key(), key()]
    decisions = [t.choose(k, ["c", "a", "b"]) for k in senders]
    start = "abc".index(decisions[0].replica)
    assert [d.replica for d in decisions] == ["abc"[(start + i) % 3] for i in range(len(senders))]
    assert decisions[0].ranked == tuple("abc"[(start + i) % 3] for i in range(3))  # full: the next in rotation
    for k in senders[:3]:  # the loads are now uneven: the rotation goes on regardless
        t.finished(k.call_id)
    after = [t.choose(key(), ["a", "b", "c"]).replica for _ in range(3)]
    assert after == ["abc"[(start + 8 + i) % 3] for i in range(3)]


def test_a_lost_replica_is_never_chosen_again_and_its_keys_go_to_the_next_of_their_order():
    t = table(replicas=("a", "b", "c"))
    placement = "session:s"
    home, second = rendezvous(placement, "abc")[:2]
    assert t.choose(key("s"), "abc").replica == home
    t.replica_lost(home)
    for _ in range(3):  # Ray Serve may still list it for a while
        assert t.choose(key("s"), "abc").replica == second
    assert home not in t.live()
    assert t.choose(key(), [home]) is None  # nothing usable: the caller waits for replicas


def test_a_replica_that_comes_back_gets_its_keys_back():
    t = table(imbalance=100, replicas=("a", "b", "c"))
    keys = [f"s{i}" for i in range(30)]
    before = {k: t.choose(key(k), "abc").replica for k in keys}
    t.replicas_changed(["a", "b"])
    during = {k: t.choose(key(k), "ab").replica for k in keys}
    t.replicas_changed(["a", "b", "c"])
    after = {k: t.choose(key(k), "abc").replica for k in keys}
    assert after == before
    assert {k for k in keys if during[k] != before[k]} == {k for k in keys if before[k] == "c"}


def test_records_are_bounded():
    t = table(max_prefix_blocks=3, max_pinned_sessions=2)
    for i in range(5):
        k = key(f"s{i}", digests=[10 * i, 10 * i + 1])
        t.choose(k, ["a", "b"])
        t.finished(k.call_id)
    views = t.snapshot()
    assert sum(v.prefix_blocks for v in views) == 3
    assert sum(v.pinned_sessions for v in views) == 2
    assert t.pinned("s0") is None and t.pinned("s4") is not None  # least recently used dropped first


def test_snapshot_counts_turns_by_rule():
    t = table(imbalance=0)
    home = reference_home("session:s", "ab")
    t.choose(key("s"), ["a", "b"])
    t.choose(key("s"), ["a", "b"], {home: 0})  # home answered 0: still home
    views = {v.replica: v for v in t.snapshot()}
    assert views[home].routed == {"session": 2} and views[home].inflight == 2


replica_names = st.sets(st.text("abcdefgh", min_size=1, max_size=3), min_size=1, max_size=8)
placements = st.lists(st.text(min_size=1, max_size=12), min_size=1, max_size=40, unique=True)


@settings(max_examples=200, deadline=None)
@given(replica_names, placements, st.text("abcdefgh", min_size=4, max_size=4))
def test_rendezvous_matches_the_reference_and_a_join_or_leave_moves_only_that_replicas_keys(replicas, keys, newcomer):
    replicas = sorted(replicas)
    homes = {k: rendezvous(k, replicas)[0] for k in keys}
    assert homes == {k: reference_home(k, replicas) for k in keys}
    if newcomer not in replicas:  # a replica joins: a key moves only if the newcomer is its new home
        joined = {k: reference_home(k, [*replicas, newcomer]) for k in keys}
        assert all(joined[k] in (homes[k], newcomer) for k in keys)
        assert {k for k in keys if joined[k] == newcomer} == {k for k in keys if joined[k] != homes[k]}
    if len(replicas) > 1:  # a replica leaves: only its keys move, each to the next of its order
        gone = replicas[len(keys) % len(replicas)]
        left = [r for r in replicas if r != gone]
        for k in keys:
            after = rendezvous(k, left)[0]
            assert after == (homes[k] if homes[k] != gone else rendezvous(k, replicas)[1])


@settings(max_examples=100, deadline=None)
@given(replica_names, placements)
def test_the_table_places_every_key_at_its_rendezvous_home_when_loads_are_even(replicas, keys):
    replicas = sorted(replicas)
    t = table(imbalance=0, replicas=replicas)
    for k in keys:
        decision = t.choose(key(k), replicas, dict.fromkeys(replicas, 0))
        assert (decision.replica, decision.rule) == (reference_home("session:" + k, replicas), Rule.SESSION)


operations = st.lists(
    st.one_of(
        st.tuples(st.just("turn"), st.sampled_from([None, "s1", "s2", "s3"]), st.lists(st.integers(0, 5), max_size=3)),
        st.tuples(st.just("finish"), st.integers(0, 50), st.just([])),
        st.tuples(st.just("lose"), st.sampled_from(["a", "b", "c"]), st.just([])),
    ),
    max_size=60,
)


@settings(max_examples=150, deadline=None)
@given(operations, st.sampled_from(["prefix", "round_robin"]), st.integers(0, 3))
def test_invariants_hold_under_any_sequence(ops, mode, imbalance):
    t = table(mode=mode, imbalance=imbalance, replicas=("a", "b", "c"))
    outstanding: dict[str, str] = {}  # call id -> replica (the reference: what must be in flight)
    lost: set[str] = set()
    previous: tuple[str, frozenset] | None = None  # round robin: the last turn's replica, and the replicas lost then
    for op, arg, digests in ops:
        if op == "turn":
            k = key(arg, digests, digests[0] if digests else None)
            decision = t.choose(k, ["a", "b", "c"])
            if decision is None:
                assert lost == {"a", "b", "c"}
                continue
            assert decision.replica not in lost
            assert sorted(decision.ranked) == sorted(set("abc") - lost)
            if mode == "prefix" and k.placement is not None:  # the first of the key's order within the threshold
                usable = sorted(set("abc") - lost)
                loads = {r: t.load(r) - (r == decision.replica) for r in usable}  # as they were before this turn
                low = min(loads.values())
                expected = next(r for r in rendezvous(k.placement, usable) if loads[r] - low <= imbalance)
                assert decision.replica == expected
            if mode == "round_robin" and previous is not None and previous[1] == lost:  # the next one in rotation
                usable = sorted(set("abc") - lost)
                assert decision.replica == usable[(usable.index(previous[0]) + 1) % len(usable)]
            previous = (decision.replica, frozenset(lost))
            outstanding[k.call_id] = decision.replica
        elif op == "finish" and outstanding:
            call = sorted(outstanding)[arg % len(outstanding)]
            t.finished(call)
            del outstanding[call]
        elif op == "lose":
            t.replica_lost(arg)
            lost.add(arg)
        for replica in "abc":
            assert t.load(replica) == sum(r == replica for r in outstanding.values())
