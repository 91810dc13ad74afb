"""Stored responses of ``/v1/responses``: what ``previous_response_id`` continues, owned by their tenant.

A stored response keeps the conversation it ended (the earlier turns, its input and its output, as chat messages)
and the response object sent back. A request that names it continues that conversation, so an agent step sends only
its new input while the prompt is the whole conversation, rendered as before: the prefix cache serves it. Another
tenant's id reads as an unknown one. The store is in memory and bounded (least recently used dropped first); a
response dropped or lost with a restart is "not found", and the client sends the conversation again.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

DEFAULT_CAPACITY = 10_000  # responses kept


@dataclass(frozen=True, slots=True)
class StoredResponse:
    owner: str  # the tenant id
    messages: tuple[dict[str, Any], ...]  # the conversation up to and including this response's output
    body: dict[str, Any]  # the response object as sent


class ResponseStore:
    """Thread-safe; bounded to ``capacity`` responses."""

    def __init__(self, capacity: int = DEFAULT_CAPACITY) -> None:
        self.capacity = capacity
        self._items: OrderedDict[str, StoredResponse] = OrderedDict()
        self._lock = threading.Lock()

    def put(self, response_id: str, stored: StoredResponse) -> None:
        with self._lock:
            self._items[response_id] = stored
            self._items.move_to_end(response_id)
            while len(self._items) > self.capacity:
                self._items.popitem(last=False)

    def get(self, response_id: str, owner: str) -> StoredResponse | None:
        """The response, if it exists and belongs to ``owner`` (else None: the same answer either way)."""
        with self._lock:
            found = self._items.get(response_id)
            if found is None or found.owner != owner:
                return None
            self._items.move_to_end(response_id)
            return found

    def delete(self, response_id: str, owner: str) -> bool:
        with self._lock:
            found = self._items.get(response_id)
            if found is None or found.owner != owner:
                return False
            del self._items[response_id]
            return True

    def __len__(self) -> int:
        return len(self._items)
