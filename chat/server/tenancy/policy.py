"""What a tenant may do: its :class:`TenantPolicy` (limits and default priority) as the keys file writes it, and
the server-wide defaults that fill what the file leaves out.

In the keys file (``chat/server/tenancy/auth.py``) a tenant's values are named fields::

    concurrent_turns, requests_per_minute, tokens_per_minute, open_sessions   an integer >= 1, or none / null
    priority                                                                  an integer in [-100, 100]

``none`` (JSON ``null``) means no limit for that tenant, whatever the server's default; a field left out takes the
server's default (``--tenant-concurrent-turns`` ... ``--tenant-priority``). An unknown field or a malformed value is
a :class:`PolicyError` naming it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from chat.protocol.limits import MAX_PRIORITY
from chat.server.tenancy.ratelimit import LIMIT_NAMES, Limits

POLICY_FIELDS = (*LIMIT_NAMES, "priority")  # the fields a tenant's entry may hold


class PolicyError(ValueError):
    """A tenant's entry holds an unknown field or a malformed value; the message names it."""


@dataclass(frozen=True, slots=True)
class TenantPolicy:
    """One tenant's values from the keys file: limits set there (a field given as none/null: no limit), and the
    priority of its turns that give none."""

    limits: Limits = field(default_factory=Limits)  # None for a limit the file leaves out or lifts
    lifted: frozenset[str] = frozenset()  # limits the file gives as none/null: no limit, whatever the default
    priority: int | None = None  # None: the server's default priority

    def resolve(self, defaults: TenantPolicy) -> tuple[Limits, int]:
        """The limits in force (this tenant's over ``defaults``, lifted ones None) and the default priority."""
        merged = self.limits.over(defaults.limits)
        values = {name: None if name in self.lifted else getattr(merged, name) for name in LIMIT_NAMES}
        priority = self.priority if self.priority is not None else defaults.priority
        return Limits(**values), priority if priority is not None else 0


def parse_policy(values: Mapping[str, object], where: str) -> TenantPolicy:
    """A tenant's policy from its named fields (text values, as the line format gives them, are read as integers
    or ``none``).

    Raises:
        PolicyError: an unknown field, a limit that is not an integer >= 1 or none, a priority out of range.
    """
    limits: dict[str, int | None] = {}
    lifted: set[str] = set()
    priority = None
    for name, raw in values.items():
        if name not in POLICY_FIELDS:
            raise PolicyError(f"{where}: unknown field {name!r} (known: {', '.join(POLICY_FIELDS)})")
        value = _number(raw, where, name)
        if name == "priority":
            if value is None or not -MAX_PRIORITY <= value <= MAX_PRIORITY:
                raise PolicyError(f"{where}: priority must be an integer in [{-MAX_PRIORITY}, {MAX_PRIORITY}]")
            priority = value
        elif value is None:
            lifted.add(name)
        elif value < 1:
            raise PolicyError(f"{where}: {name} must be an integer >= 1, or none for no limit")
        else:
            limits[name] = value
    return TenantPolicy(Limits(**limits), frozenset(lifted), priority)


def _number(raw: object, where: str, name: str) -> int | None:
    if raw is None or raw == "none":
        return None
    if isinstance(raw, str) and raw.lstrip("-").isdigit():
        return int(raw)
    if isinstance(raw, int) and not isinstance(raw, bool):
        return raw
    raise PolicyError(f"{where}: {name} must be an integer or none")
