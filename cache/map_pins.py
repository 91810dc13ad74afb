"""The prefix cache's pins, the map's side: pin, renew, expire, and settle an entry that went idle (part of
:class:`cache.PrefixCache`, split off by length; the bookkeeping of pins is :mod:`cache.pins`, the bound on pinned
bytes :meth:`cache.policy.TierPolicy.pin_fits`). See cache/DESIGN.md, *Pins*."""

from __future__ import annotations

import math
from array import array
from collections.abc import Callable, Iterable

from cache.entry_rules import exact_media_cut
from cache.errors import LengthError, NamespaceError
from cache.map_entry import Entry
from cache.media import MediaSpan, SpanFloor, check_spans, check_tokens, encode_keys
from cache.namespace import Namespace
from cache.pins import PinTable, prefix_digest
from cache.policy import TierPolicy
from cache.radix import EntryId, RadixIndex
from cache.records import PinInfo, PinResult
from cache.tiers import DEVICE, DISK, HOST


class PinOps:
    """Pins on the map's entries. Mixed into :class:`cache.PrefixCache`, whose state it uses."""

    _entries: dict[EntryId, Entry]
    _indexes: dict[Namespace, RadixIndex]
    _pins: PinTable
    _pin_tally: dict[str, dict[str, int]]
    _policy: TierPolicy
    _counters: dict[str, int]
    _clock_fn: Callable[[], float]

    def pin(
        self,
        namespace: Namespace,
        tokens: Iterable[int],
        length: int,
        ttl_s: float,
        *,
        media: Iterable[MediaSpan] = (),
    ) -> PinResult:
        """Hold the prefix ``tokens[:length]`` of ``namespace`` for ``ttl_s`` seconds after its last use.

        The pin lives on the most recently used entry that restores that prefix at exactly ``length`` (read back if
        only on disk, moved to the device tier if on the host tier), which is then treated as an entry in use: never
        moved out of the device tier, never dropped, until the pin lapses; an entry that supersedes it takes the pin
        over. Pinning a prefix already pinned renews it (never refused). A new pin is refused, as a hint not taken,
        when no entry restores the prefix at exactly ``length`` (``not_cached``) or when its entry would take the
        tenant's pinned bytes past its share of the device budget (the whole budget with shares off), or all pinned
        bytes past the device budget (``over_share``). A lookup hit at ``length`` or beyond on the holder is a use.

        Raises:
            TokenError, SpanError, LengthError, NamespaceError: bad input; nothing changed.
        """
        if not isinstance(namespace, Namespace):
            raise NamespaceError(f"expected a Namespace, got {type(namespace).__name__}")
        token_list = check_tokens(tokens)
        spans = check_spans(media, len(token_list))
        if isinstance(length, bool) or not isinstance(length, int) or not 1 <= length <= len(token_list):
            raise LengthError(f"length must be an integer in [1, {len(token_list)}], got {length!r}")
        if isinstance(ttl_s, bool) or not isinstance(ttl_s, int | float) or not 0 < ttl_s < math.inf:
            raise LengthError(f"ttl_s must be a positive finite number of seconds, got {ttl_s!r}")
        self._collect_disk()
        self._expire()
        self._adopt(namespace)
        now = self._clock_fn()
        keys = encode_keys(token_list, spans)[:length]
        key = (namespace, prefix_digest(keys))
        existing = self._pins.get(key)
        if existing is not None:
            self._pins.refresh(existing, now, float(ttl_s))
            self._touch(self._entries[existing.holder])
            self._counters["pins_renewed"] += 1
            return PinResult(True, length, None, existing.expires, renewed=True)
        entry = self._pin_holder(namespace, keys, spans, length)
        reason = "not_cached" if entry is None else None
        if entry is not None and not self._pin_fits(entry):
            reason = "over_share"
        if reason is not None:
            self._counters["pins_refused"] += 1
            self._tally(namespace.salt, "refused")
            self._enforce_budgets()  # a holder read back from disk for nothing may go again
            return PinResult(False, length, reason)
        assert entry is not None
        if entry.tier == HOST:
            self._move(entry, DEVICE)
            self._counters["promotions"] += 1
        pin = self._pins.add(key, length, float(ttl_s), now, entry.eid)
        self._set_busy(entry, True)
        self._touch(entry)
        self._counters["pins_made"] += 1
        self._enforce_budgets()
        return PinResult(True, length, None, pin.expires)

    def pins(self) -> list[PinInfo]:
        """The live pins, oldest first."""
        self._expire()
        return [
            PinInfo(pin.key[0], pin.length, pin.ttl, pin.expires, pin.holder)  # type: ignore[arg-type]
            for pin in sorted(self._pins, key=lambda p: p.number)
        ]

    def expire_pins(self) -> int:
        """Release the pins whose time has passed (every other call does this first too). Returns how many."""
        return self._expire()

    # ================================================================ helpers: pins

    def _expire(self) -> int:
        """Release the pins whose time has passed; their holders become idle unless used or pinned otherwise. Then
        the budgets are enforced (once, after every lapsed pin is released)."""
        if not len(self._pins):
            return 0
        due = self._pins.due(self._clock_fn())
        if not due:
            return 0
        self._counters["pins_expired"] += len(due)
        for pin in due:
            self._tally(pin.key[0].salt, "expired")  # type: ignore[attr-defined]
            entry = self._entries.get(pin.holder)
            if entry is not None:
                self._settle(entry)
        self._enforce_budgets()
        return len(due)

    def _settle(self, entry: Entry) -> None:
        """``entry`` may have gone idle (a lease released, a pin lapsed): if so it leaves the busy set, and a
        superseded one is dropped if an entry that serves all it serves is held."""
        if entry.users or self._pins.holds(entry.eid):
            return
        self._set_busy(entry, False)
        if entry.superseded:
            entry.superseded = False
            if self._indexes[entry.namespace].covered_by_other(entry.eid, SpanFloor(entry.media)):
                self._drop(entry)
                self._counters["superseded"] += 1

    def _pin_holder(self, namespace: Namespace, keys: array, spans: tuple[MediaSpan, ...], length: int) -> Entry | None:
        """The most recently used entry that restores ``keys`` (a prefix's) at exactly ``length``, in memory (read
        back from disk if need be); None if there is none."""
        floor = SpanFloor(spans)
        if floor(length) != length:
            return None  # inside a media item: nothing can be restored there
        while True:
            index = self._indexes.get(namespace)
            if index is None:
                return None
            found = index.best(keys, length, floor)
            if found is None or found[0] != length:
                return None
            entry = self._entries[found[1]]
            if exact_media_cut(entry.media, spans, length) != length:
                return None  # a 62-bit media key collided
            if entry.tier != DISK or self._read_back(entry):
                return entry

    def _pin_fits(self, entry: Entry) -> bool:
        """Whether pinning ``entry`` keeps the pinned bytes within their bounds (:meth:`TierPolicy.pin_fits`)."""
        return self._policy.pin_fits(entry.eid, self._pins.holders())

    def _pinned(self) -> list[Entry]:
        """The entries holding pins."""
        return [self._entries[eid] for eid in sorted(self._pins.holders())]

    def _tally(self, salt: str, what: str) -> None:
        counts = self._pin_tally.setdefault(salt, {"refused": 0, "expired": 0})
        counts[what] += 1

    def _pinned_per_tenant(self) -> dict[str, dict[str, int]]:
        by_salt: dict[str, list[Entry]] = {salt: [] for salt in self._pin_tally}
        for entry in self._pinned():
            by_salt.setdefault(entry.namespace.salt, []).append(entry)
        out: dict[str, dict[str, int]] = {}
        for salt, entries in sorted(by_salt.items()):
            out[salt] = {
                "pins": sum(self._pins.holds(e.eid) for e in entries),
                "entries": len(entries),
                "bytes": self._policy.storage_bytes(e.eid for e in entries),
                **self._pin_tally.get(salt, {"refused": 0, "expired": 0}),
            }
        return out
