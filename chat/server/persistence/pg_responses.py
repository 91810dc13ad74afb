"""Stored responses of ``/v1/responses`` in PostgreSQL: what ``previous_response_id`` continues, from any ingress.

The same surface and semantics as the in-memory :class:`~chat.server.persistence.response_store.ResponseStore` (owned by
their tenant; another tenant's id reads as an unknown one; bounded, oldest dropped first), in the ``responses`` table of
the sessions database (``pg_database.py``). A response is one row, written in one statement: a request that names it on
another ingress finds it as soon as the response was sent.
"""

from __future__ import annotations

import json
import logging
import time

from chat.server.persistence.pg_database import PgDatabase
from chat.server.persistence.response_store import DEFAULT_CAPACITY, StoredResponse

log = logging.getLogger("turncache.sessions")
PRUNE_EVERY = 256  # puts between two trims of the table to its capacity


class PostgresResponseStore:
    """Thread-safe (through the database's one connection); bounded to about ``capacity`` responses."""

    def __init__(self, db: PgDatabase, capacity: int = DEFAULT_CAPACITY) -> None:
        self.db = db  # shared with the session store, which closes it
        self.capacity = capacity
        self._puts = 0

    def put(self, response_id: str, stored: StoredResponse) -> None:
        """Keep a response. A database that cannot be reached is logged: the response was sent all the same, and a
        later ``previous_response_id`` naming it is answered ``not_found`` (the client sends the conversation)."""
        row = (response_id, stored.owner, json.dumps(list(stored.messages)), json.dumps(stored.body), time.time())
        try:
            self.db.run(
                lambda c: c.execute(
                    "INSERT INTO responses VALUES (%s, %s, %s, %s, %s) ON CONFLICT (id) DO UPDATE SET owner = "
                    "EXCLUDED.owner, messages = EXCLUDED.messages, body = EXCLUDED.body, created = EXCLUDED.created",
                    row,
                )
            )
        except self.db._psycopg.Error as exc:
            log.warning("could not keep response %s (%s)", response_id, exc)
            return
        self._puts += 1
        if self._puts % PRUNE_EVERY == 0:
            self.db.run(self._prune)

    def get(self, response_id: str, owner: str) -> StoredResponse | None:
        """The response, if it exists and belongs to ``owner`` (else None: the same answer either way)."""
        row = self.db.run(
            lambda c: c.execute(
                "SELECT messages, body FROM responses WHERE id = %s AND owner = %s", (response_id, owner)
            ).fetchone(),
            transaction=False,
        )
        if row is None:
            return None
        return StoredResponse(owner, tuple(json.loads(row[0])), json.loads(row[1]))

    def delete(self, response_id: str, owner: str) -> bool:
        return bool(
            self.db.run(
                lambda c: c.execute("DELETE FROM responses WHERE id = %s AND owner = %s", (response_id, owner)).rowcount
            )
        )

    def __len__(self) -> int:
        return self.db.run(lambda c: c.execute("SELECT count(*) FROM responses").fetchone()[0], transaction=False)

    def _prune(self, c) -> None:
        c.execute(
            "DELETE FROM responses WHERE created < (SELECT created FROM responses ORDER BY created DESC "
            "OFFSET %s LIMIT 1)",
            (self.capacity - 1,),
        )
