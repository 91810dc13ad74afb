"""The routing rule over a RoutingTable: no Ray, replicas are names."""

import itertools

from hypothesis import given, settings
from hypothesis import strategies as st

from chat.cluster.routing import RouteKey, RoutingPolicy, RoutingTable, Rule, SessionRef

ids = itertools.count()


def key(session=None, digests=(), first_turn=False):
    ref = SessionRef(session, first_turn) if session is not None else None
    return RouteKey(f"call-{next(ids)}", ref, tuple(digests))


def table(mode="prefix", imbalance=4, replicas=("a", "b"), **policy):
    t = RoutingTable(RoutingPolicy(mode=mode, imbalance=imbalance, **policy))
    t.replicas_changed(replicas)
    return t


def test_a_session_stays_on_its_replica_whatever_the_load():
    t = table(imbalance=0)
    first = t.choose(key("s1"), ["a", "b"])
    assert first.rule is Rule.LEAST_LOADED
    for _ in range(5):  # load piles up on the session's replica; the session still goes there
        decision = t.choose(key("s1"), ["a", "b"])
        assert (decision.replica, decision.rule) == (first.replica, Rule.SESSION)
    assert t.pinned("s1") == first.replica


def test_new_sessions_spread_over_idle_replicas():
    t = table()
    chosen = [t.choose(key(f"s{i}"), ["a", "b"]).replica for i in range(4)]
    assert sorted(chosen) == ["a", "a", "b", "b"]  # ties go to the replica with fewer pinned sessions


def test_first_turns_of_sessions_are_pinned_by_load_not_by_a_shared_system_prompt():
    t = table()
    system = [11, 12]  # the digests every session's first prompt shares
    chosen = [t.choose(key(f"s{i}", digests=[*system, 100 + i], first_turn=True), ["a", "b"]) for i in range(4)]
    assert sorted(d.replica for d in chosen) == ["a", "a", "b", "b"]
    assert all(d.rule is Rule.LEAST_LOADED for d in chosen)


def test_a_session_that_lost_its_pin_is_routed_to_its_conversation_by_prefix():
    t = table(imbalance=100)
    t.choose(key(digests=[1, 2, 3]), ["b"])  # b holds the conversation (served before the ingress restarted)
    decision = t.choose(key("resumed", digests=[1, 2, 3, 4]), ["a", "b"])
    assert (decision.replica, decision.rule, t.pinned("resumed")) == ("b", Rule.PREFIX, "b")


def test_a_longer_conversation_finds_the_replica_of_its_shorter_prefix():
    t = table()
    served = t.choose(key(digests=[1, 2]), ["a", "b"])
    t.choose(key(digests=[9]), ["a", "b"])  # another conversation: load on the other replica
    longer = t.choose(key(digests=[1, 2, 3, 4]), ["a", "b"])
    assert (longer.replica, longer.rule, longer.matched_blocks) == (served.replica, Rule.PREFIX, 2)


def test_the_longest_known_digest_wins():
    t = table(imbalance=100)
    t.choose(key(digests=[1]), ["a"])  # only a can take it: a served [1]
    t.choose(key(digests=[1, 2, 3]), ["b"])  # b served the longer prefix
    decision = t.choose(key(digests=[1, 2, 3, 4]), ["a", "b"])
    assert (decision.replica, decision.matched_blocks) == ("b", 3)


def test_an_overloaded_preferred_replica_gives_way_to_the_least_loaded_one():
    t = table(imbalance=2)
    home = t.choose(key(digests=[7]), ["a", "b"]).replica
    other = "b" if home == "a" else "a"
    for _ in range(2):  # home runs 3 turns, the other none: 3 - 0 > 2
        t.choose(key(digests=[100 + next(ids)]), [home])
    moved = t.choose(key(digests=[7, 8]), ["a", "b"])
    assert (moved.replica, moved.rule) == (other, Rule.LEAST_LOADED)
    again = t.choose(key(digests=[7, 8, 9]), ["a", "b"])  # the conversation follows its cache ("last served")
    assert (again.replica, again.rule) == (other, Rule.PREFIX)


def test_at_the_threshold_the_preferred_replica_keeps_the_turn():
    t = table(imbalance=2)
    home = t.choose(key(digests=[7]), ["a", "b"]).replica
    t.choose(key(digests=[55]), [home])  # home runs 2, the other 0: 2 - 0 == 2
    assert t.choose(key(digests=[7, 8]), ["a", "b"]).replica == home


def test_finished_turns_release_their_load():
    t = table(imbalance=0)
    k = key(digests=[3])
    home = t.choose(k, ["a", "b"]).replica
    assert t.load(home) == 1 and t.inflight() == 1
    t.finished(k.call_id)
    t.finished(k.call_id)  # twice is harmless
    assert t.load(home) == 0 and t.inflight() == 0
    assert t.choose(key(digests=[3, 4]), ["a", "b"]).replica == home  # 0 - 0 <= 0: affinity kept


def test_choosing_again_for_the_same_call_replaces_the_first_choice():
    t = table()
    k = key(digests=[5])
    t.choose(k, ["a", "b"])
    t.choose(k, ["a", "b"])  # Ray Serve retried the routing of this call
    assert t.inflight() == 1


def test_routed_elsewhere_moves_load_pins_and_prefixes():
    t = table(imbalance=100)
    k = key("s", digests=[1, 2])
    first = t.choose(k, ["a", "b"]).replica
    other = "b" if first == "a" else "a"
    t.routed(k.call_id, other)  # the first choice was full; Ray Serve took the next rank
    assert (t.load(first), t.load(other), t.pinned("s")) == (0, 1, other)
    assert t.choose(key(digests=[1, 2, 3]), ["a", "b"]).replica == other


def test_ranks_put_the_choice_first_then_the_others_by_load():
    t = table(replicas=("a", "b", "c"))
    t.choose(key(digests=[1]), ["b"])
    t.choose(key(digests=[2]), ["b"])
    t.choose(key(digests=[3]), ["c"])
    decision = t.choose(key(digests=[1, 9]), ["a", "b", "c"])
    assert decision.ranked == ("b", "a", "c")


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


def test_a_lost_replica_is_never_chosen_again_and_its_sessions_are_pinned_anew():
    t = table()
    home = t.choose(key("s", digests=[1]), ["a", "b"]).replica
    other = "b" if home == "a" else "a"
    t.replica_lost(home)
    assert t.pinned("s") is None
    for _ in range(3):  # Ray Serve may still list it for a while
        decision = t.choose(key("s", digests=[1, 2]), ["a", "b"])
        assert decision.replica == other
    assert t.pinned("s") == other and t.live() == (other,)
    assert t.choose(key(), [home]) is None  # nothing usable: the caller waits for replicas


def test_a_replaced_replica_drops_its_entries_and_the_new_one_takes_new_sessions():
    t = table()
    home = t.choose(key("s1", digests=[1]), ["a", "b"]).replica
    other = "b" if home == "a" else "a"
    t.replicas_changed([other, "c"])  # home is gone, c restarted in its place
    assert t.pinned("s1") is None
    assert [v.replica for v in t.snapshot()] == sorted([other, "c"])
    assert t.choose(key("s2"), [other, "c"]).replica in (other, "c")
    assert t.choose(key("s3"), [other, "c"]).replica != t.pinned("s2")  # one session each


def test_prefix_blocks_and_pins_are_bounded():
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
    t = table()
    k = key("s")
    t.choose(k, ["a", "b"])
    t.choose(key("s"), ["a", "b"])
    (view,) = [v for v in t.snapshot() if v.pinned_sessions]
    assert view.routed == {"least_loaded": 1, "session": 1} and view.inflight == 2


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
            pinned = t.pinned(arg) if arg else None
            k = key(arg, digests)
            decision = t.choose(k, ["a", "b", "c"])
            if decision is None:
                assert lost == {"a", "b", "c"}
                continue
            assert decision.replica not in lost
            assert sorted(decision.ranked) == sorted(set("abc") - lost)
            if mode == "prefix" and pinned is not None:
                assert decision.replica == pinned and decision.rule is Rule.SESSION
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
            assert all(t.pinned(s) != arg for s in ("s1", "s2", "s3"))
        for replica in "abc":
            assert t.load(replica) == sum(r == replica for r in outstanding.values())
