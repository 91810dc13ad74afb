"""What the reply tests share: a LoRA adapter bank's stand-in."""

from __future__ import annotations

from types import SimpleNamespace


class Bank:
    def __init__(self, *names: str) -> None:
        self.named = {n: SimpleNamespace(name=n, source=f"/adapters/{n}") for n in names}

    def find(self, name):
        return self.named.get(name)

    def adapters(self):
        return list(self.named.values())
