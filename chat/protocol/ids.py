"""Ids the protocol hands out: ``sess_``, ``turn_``, ``msg_`` followed by 24 random hex digits (96 bits).

A session id is a capability (whoever knows it can resume the session), hence random and unguessable.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable

IdFactory = Callable[[str], str]  # prefix -> new id; tests pass a counter to get predictable ids


def new_id(prefix: str) -> str:
    """A fresh id such as ``turn_3f9c0a...``."""
    return f"{prefix}_{secrets.token_hex(12)}"
