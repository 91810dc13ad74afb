"""chat/cluster/ray_router.py without Ray: what the router tells Ray Serve for each kind of call (a turn: the table's
choice then the rest; a control call: its replica; anything else: the least busy first), the replicas' probed queue
lengths, a dead replica left out, and the table kept in step with Ray Serve's callbacks. The table's rules themselves:
test_routing.py; the router in a live cluster: test_live.py."""

import asyncio
import itertools
from types import SimpleNamespace

import pytest
from ray.exceptions import ActorDiedError
from ray.serve.request_router import RequestRouter

from chat.cluster.ray_router import TurncacheRouter, table_name
from chat.cluster.routing import RouteKey, SessionRef, rendezvous, table_for
from chat.cluster.wire import ToReplica, TurnCall

_apps = itertools.count()


class Replica:
    """What the router reads of Ray Serve's RunningReplica: its id and its queue-length probe."""

    def __init__(self, name: str, queue: int | BaseException | None = 0) -> None:
        self.replica_id = SimpleNamespace(unique_id=name)
        self.queue = queue  # None: never answers

    async def get_queue_len(self, deadline_s: float) -> int:
        if self.queue is None:
            await asyncio.sleep(10 * deadline_s)
        if isinstance(self.queue, BaseException):
            raise self.queue
        return self.queue


def request(first=None, request_id: str = "req-1"):
    return SimpleNamespace(
        args=[first] if first is not None else [],
        routing_context=SimpleNamespace(should_backoff=False),
        metadata=SimpleNamespace(internal_request_id=request_id),
    )


@pytest.fixture
def router(monkeypatch):
    """A router as Ray Serve sets it up (its own table, under a name of its own per test); the base class's
    bookkeeping of replicas is Ray Serve's and is left out."""
    monkeypatch.setattr(RequestRouter, "update_replicas", lambda self, replicas: None)
    monkeypatch.setattr(RequestRouter, "on_replica_actor_died", lambda self, replica_id: None)
    made = TurncacheRouter.__new__(TurncacheRouter)
    made._deployment_id = SimpleNamespace(app_name=f"test-{next(_apps)}", name="EngineReplica")
    made.initialize_state(policy={"mode": "prefix", "imbalance": 4})
    return made


def ranks(answer) -> list[str]:
    assert all(len(rank) == 1 for rank in answer)  # one replica per rank: Serve tries them in this order
    return [rank[0].replica_id.unique_id for rank in answer]


def test_the_table_is_the_one_the_ingress_of_this_process_finds_by_the_deployments_name(router):
    name = table_name(router._deployment_id.app_name, "EngineReplica")
    assert name == router._deployment_id.app_name + "/EngineReplica"
    assert table_for(name) is router.table and router.table.policy.imbalance == 4


def test_a_turn_goes_to_its_sessions_home_first_then_the_others_and_is_counted_until_completed(router):
    replicas = [Replica("r1"), Replica("r2"), Replica("r3")]
    router.update_replicas(replicas)
    call = TurnCall(RouteKey("call-1", session=SessionRef("s1")), turn=None)
    pending = request(call)
    order = ranks(asyncio.run(router.choose_replicas(replicas, pending)))
    assert order[0] == rendezvous("session:s1", ["r1", "r2", "r3"])[0] and sorted(order) == ["r1", "r2", "r3"]
    assert pending.routing_context.should_backoff  # every rank full: Serve backs off between rounds
    router.on_request_routed(pending, SimpleNamespace(unique_id=order[0]), None)
    assert router.table.load(order[0]) == 1 and router.table.pinned("s1") == order[0]
    router.on_request_completed(SimpleNamespace(unique_id=order[0]), "req-1")
    assert router.table.load(order[0]) == 0


def test_the_probed_queue_lengths_move_a_turn_off_a_busy_home(router):
    home = rendezvous("session:s1", ["r1", "r2"])[0]
    other = "r2" if home == "r1" else "r1"
    replicas = [Replica(home, queue=9), Replica(other, queue=0)]  # 9 > 0 + imbalance 4
    router.update_replicas(replicas)
    call = TurnCall(RouteKey("call-1", session=SessionRef("s1")), turn=None)
    assert ranks(asyncio.run(router.choose_replicas(replicas, request(call))))[0] == other


def test_a_control_call_goes_to_its_replica_and_an_untagged_call_to_the_least_busy(router):
    replicas = [Replica("r1"), Replica("r2")]
    assert ranks(asyncio.run(router.choose_replicas(replicas, request(ToReplica("r2"))))) == ["r2"]
    gone = asyncio.run(router.choose_replicas(replicas, request(ToReplica("r9"))))
    assert [[r.replica_id.unique_id for r in rank] for rank in gone] == [["r1", "r2"]]  # Serve then reports it
    router.table.choose(RouteKey("busy"), ["r1"])  # one turn in flight on r1
    assert ranks(asyncio.run(router.choose_replicas(replicas, request()))) == ["r2", "r1"]
    assert asyncio.run(router.choose_replicas([], request())) == []


def test_replicas_that_do_not_answer_in_time_are_left_out_and_a_dead_one_is_never_chosen_again(router):
    slow, dead, fine = Replica("r1", queue=None), Replica("r2", queue=ActorDiedError()), Replica("r3", queue=2)
    router.update_replicas([slow, dead, fine])
    assert asyncio.run(router.queue_lengths([slow, dead, fine])) == {"r3": 2}
    assert "r2" in router._dead
    for n in range(4):  # sessions whose home was r2 go elsewhere
        call = TurnCall(RouteKey(f"call-{n}", session=SessionRef(f"s{n}")), turn=None)
        assert "r2" not in ranks(asyncio.run(router.choose_replicas([slow, dead, fine], request(call))))


def test_the_table_follows_ray_serves_replicas(router):
    router.update_replicas([Replica("r2"), Replica("r1")])
    assert router.table.live() == ("r1", "r2")
    router.on_replica_actor_died(SimpleNamespace(unique_id="r1"))
    assert router.table.choose(RouteKey("c"), ["r1", "r2"]).replica == "r2"  # lost: never chosen again
