"""A model forward that fails on one token: for the runtimes' fall-back to one feed at a time."""

from __future__ import annotations

from typing import Any

POISON = 7  # the token id the wrapped forward refuses


class Poisoned:
    """Wraps a runtime's model (``adapter._model``): a call whose ``input_ids`` hold :data:`POISON` raises; every
    other call and attribute goes to the model. ``calls`` counts the calls, ``failed`` the refused ones."""

    def __init__(self, model: Any) -> None:
        self._wrapped = model
        self.calls = 0
        self.failed = 0

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        self.calls += 1
        if (kwargs["input_ids"] == POISON).any():
            self.failed += 1
            raise RuntimeError("poisoned token")
        return self._wrapped(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._wrapped, name)
