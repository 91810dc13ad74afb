"""The in-memory store of ``/v1/responses`` (``chat/server/persistence/response_store.py``): owned by a tenant (another
tenant's id reads as missing), bounded, the least recently used dropped first."""

from __future__ import annotations

from chat.server.persistence.response_store import ResponseStore, StoredResponse


def stored(owner: str = "alice", n: int = 0) -> StoredResponse:
    return StoredResponse(owner, ({"role": "user", "content": f"q{n}"},), {"id": f"resp_{n}"})


def test_a_response_is_read_and_deleted_by_its_owner_only():
    store = ResponseStore()
    store.put("resp_1", stored("alice", 1))
    assert store.get("resp_1", "bob") is None and store.get("resp_2", "alice") is None
    assert store.get("resp_1", "alice") == stored("alice", 1)
    assert not store.delete("resp_1", "bob") and store.get("resp_1", "alice") is not None
    assert store.delete("resp_1", "alice") and store.get("resp_1", "alice") is None
    assert not store.delete("resp_1", "alice") and len(store) == 0


def test_past_its_capacity_the_least_recently_used_response_is_dropped():
    store = ResponseStore(capacity=2)
    store.put("a", stored(n=1))
    store.put("b", stored(n=2))
    assert store.get("a", "alice") is not None  # read: now "b" is the least recently used
    store.put("c", stored(n=3))
    assert len(store) == 2
    assert [store.get(r, "alice") is not None for r in ("a", "b", "c")] == [True, False, True]


def test_putting_an_id_again_replaces_it_and_counts_as_a_use():
    store = ResponseStore(capacity=2)
    store.put("a", stored(n=1))
    store.put("b", stored(n=2))
    store.put("a", stored("bob", 3))  # replaced, and now the most recent
    store.put("c", stored(n=4))
    assert store.get("a", "alice") is None and store.get("a", "bob") == stored("bob", 3)
    assert store.get("b", "alice") is None and len(store) == 2
