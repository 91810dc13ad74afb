"""Stored responses in PostgreSQL (``chat/server/persistence/pg_responses.py``), on a real server."""

from __future__ import annotations

from chat.server.persistence.pg_sessions import PostgresSessionStore


def test_stored_responses_are_pruned_to_their_capacity_oldest_first(postgres_url, monkeypatch):
    from chat.server.persistence import pg_responses
    from chat.server.persistence.pg_responses import PostgresResponseStore
    from chat.server.persistence.response_store import StoredResponse

    monkeypatch.setattr(pg_responses, "PRUNE_EVERY", 5)
    store = PostgresSessionStore(postgres_url)
    responses = PostgresResponseStore(store.db, capacity=3)
    for i in range(5):
        responses.put(f"resp_{i}", StoredResponse("t", (), {"id": f"resp_{i}"}))
    assert len(responses) == 3
    assert [responses.get(f"resp_{i}", "t") is not None for i in range(5)] == [False, False, True, True, True]
    store.close()
