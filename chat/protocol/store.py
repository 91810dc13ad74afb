"""Where sessions live between events: the :class:`SessionStore` interface and an in-memory implementation.

A store hands out live :class:`Session` objects; the connection mutates them and calls ``save`` after every
change, so that a persistent store can write them out. The in-memory store keeps references, so ``save``
only marks the session as recently used.

Every session has an owner (an opaque tenant id, ``""`` by default): ``get`` finds a session only for its owner, and
answers anyone else exactly as it answers an id that does not exist.

An owner may have a quota of sessions in memory (``quota(owner)``, the tenant's ``open_sessions``): a new session of an
owner at its quota first closes that owner's own least recently used idle session (never another owner's), so a
tenant that opens many sessions pushes out only its own; when every one of its sessions is generating, the new one is
refused with ``rate_limited``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections import OrderedDict
from collections.abc import Callable

from chat.protocol.errors import ErrorCode, ProtocolError
from chat.protocol.ids import IdFactory, new_id
from chat.protocol.sampling import SamplingSettings
from chat.protocol.session import Session, SessionState

MAX_SESSIONS = 1024  # sessions the in-memory store keeps; the least recently used idle one is closed beyond that


def unknown_session(session_id: str, event_id: str | None) -> ProtocolError:
    """The one answer for a session id that names no live session of the asker (missing, closed, or not theirs)."""
    return ProtocolError(ErrorCode.UNKNOWN_SESSION, f"no session has id {session_id!r}", event_id)


class SessionStore(ABC):
    """Creates, finds and keeps sessions."""

    @abstractmethod
    def create(
        self, model: str, system: str | None = None, sampling: SamplingSettings | None = None, *, owner: str = ""
    ) -> Session:
        """A new, stored, idle session owned by ``owner``. The caller must send ``session.created`` with
        ``session.info()``.

        Raises:
            ProtocolError: ``busy`` when the store is full of sessions that are generating.
        """

    @abstractmethod
    def get(self, session_id: str, event_id: str | None = None, *, owner: str = "") -> Session:
        """The live session with this id, if ``owner`` owns it.

        Raises:
            ProtocolError: ``unknown_session`` (with ``event_id``) when there is none, it was closed, or another
                owner's: the same message in every case.
        """

    @abstractmethod
    def save(self, session: Session) -> None:
        """Record the session's current state. The caller must call it after every change to the session."""

    def when_written(self, session_id: str, callback: Callable[[], None]) -> None:
        """Call ``callback`` (on any thread) once every change saved so far to ``session_id`` is durable; a store
        that writes nowhere calls it at once. A transport uses it to acknowledge a change only once it is kept."""
        callback()

    def close(self) -> None:  # noqa: B027 - optional: only stores that hold resources override it
        """Release what the store holds (a persistent store first writes what is pending). Idempotent."""


class InMemorySessionStore(SessionStore):
    """Sessions in a dict, at most ``max_sessions``; beyond that the least recently used idle session is closed."""

    def __init__(
        self,
        max_sessions: int = MAX_SESSIONS,
        new_id: IdFactory = new_id,
        *,
        quota: Callable[[str], int | None] | None = None,
    ) -> None:
        if max_sessions < 1:
            raise ValueError("max_sessions must be >= 1")
        self.max_sessions = max_sessions  # sessions kept at most
        self.quota = quota  # owner -> most sessions it keeps in memory (None: no quota); see the module docstring
        self._new_id = new_id  # makes session, turn and message ids
        self._sessions: OrderedDict[str, Session] = OrderedDict()  # least recently used first

    def __len__(self) -> int:
        return len(self._sessions)

    def __contains__(self, session_id: object) -> bool:
        return session_id in self._sessions

    def create(
        self, model: str, system: str | None = None, sampling: SamplingSettings | None = None, *, owner: str = ""
    ) -> Session:
        self._make_room(owner)
        session = Session(model, system=system, sampling=sampling, owner=owner, new_id=self._new_id)
        self._sessions[session.id] = session
        return session

    def get(self, session_id: str, event_id: str | None = None, *, owner: str = "") -> Session:
        session = self._sessions.get(session_id)
        if session is None or session.state is SessionState.CLOSED or session.owner != owner:
            raise unknown_session(session_id, event_id)
        self._sessions.move_to_end(session_id)
        return session

    def save(self, session: Session) -> None:
        if session.state is SessionState.CLOSED:  # evicted while a turn was running: do not bring it back
            self._sessions.pop(session.id, None)
            return
        self._sessions[session.id] = session
        self._sessions.move_to_end(session.id)

    def _make_room(self, owner: str) -> None:
        """Room for one more session of ``owner``: within its quota, then within ``max_sessions``.

        Raises:
            ProtocolError: ``rate_limited`` (every session of the owner at its quota is generating) or ``busy``
                (every session in the store is generating).
        """
        limit = self.quota(owner) if self.quota is not None else None
        if limit is not None:
            own = [s for s in self._sessions.values() if s.owner == owner]  # least recently used first
            while len(own) >= limit:
                victim = next((s for s in own if s.state is SessionState.IDLE), None)
                if victim is None:
                    message = f"all {len(own)} sessions this tenant may keep are generating (open sessions is {limit})"
                    raise ProtocolError(ErrorCode.RATE_LIMITED, message)
                own.remove(victim)
                victim.close()
                del self._sessions[victim.id]
        if len(self._sessions) >= self.max_sessions:
            self._evict_one()

    def _evict_one(self) -> None:
        victim = next((s for s in self._sessions.values() if s.state is SessionState.IDLE), None)
        if victim is None:
            raise ProtocolError(ErrorCode.BUSY, f"all {self.max_sessions} sessions are generating; try again later")
        victim.close()
        del self._sessions[victim.id]
