"""Which LoRA adapter a request's ``model`` selects, the same on every surface: :class:`AdapterSelector` gives the
adapter a turn computes under (None for the base model's name, or no name), and :func:`with_adapter` /
:func:`prepared_under` put it on the engine's :class:`~chat.engine.events.TurnRequest`; the turn's cache namespace
then carries the adapter's tagged identity (chat/engine/turn.py: ``turn_namespace``). The admin routes that load
and unload adapters are ``chat.server.surfaces.lora_api``."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from chat.engine.events import TurnRequest
from chat.protocol.errors import ErrorCode
from chat.server.errors import RequestError
from chat.server.reply.reader import Prepared


class AdapterSelector:
    """Which adapter a model name selects on one runtime. The runtime's adapter bank (``runtime.adapters``) is
    None on models that run on transformers' forward (hybrid recurrent, multimodal): there, only the base model's
    name is served."""

    def __init__(self, runtime: Any, model_name: str) -> None:
        self.bank = getattr(runtime, "adapters", None)  # chat.models.decoder.lora.AdapterBank, or None
        self.model_name = model_name

    def select(self, requested: str | None) -> Any:
        """The adapter ``requested`` names (None: the base model, by its name or no name).

        Raises:
            RequestError: ``model_not_found`` for a name that is neither the model nor a loaded adapter.
        """
        if requested is None or requested == self.model_name:
            return None
        found = self.bank.find(requested) if self.bank is not None else None
        if found is None:
            message = f"unknown model {requested!r}; this server runs {self.names()}"
            raise RequestError(ErrorCode.MODEL_NOT_FOUND, message, param="model")
        return found

    def apply(self, request: TurnRequest, requested: str | None) -> TurnRequest:
        """``request`` computed under the adapter ``requested`` selects (unchanged for the base)."""
        return with_adapter(request, self.select(requested))

    def names(self) -> list[str]:
        """The base model's name, then every adapter's."""
        adapters = self.bank.adapters() if self.bank is not None else []
        return [self.model_name, *(a.name for a in adapters)]

    def cards(self) -> list[dict]:
        """``/v1/models`` entries of the adapters: each with its ``parent`` (the base model) and ``root`` (its path)."""
        adapters = self.bank.adapters() if self.bank is not None else []
        return [
            {
                "id": a.name,
                "object": "model",
                "created": 0,
                "owned_by": "local",
                "root": a.source,
                "parent": self.model_name,
            }
            for a in adapters
        ]


def with_adapter(request: TurnRequest, adapter: Any) -> TurnRequest:
    """The engine request computed under ``adapter`` (None: as it is)."""
    return request if adapter is None else dataclasses.replace(request, adapter=adapter)


def prepared_under(prepared: Prepared, adapter: Any) -> Prepared:
    """Every turn of ``prepared`` computed under ``adapter`` (None: as it is)."""
    if adapter is None:
        return prepared
    return dataclasses.replace(prepared, turns=[with_adapter(t, adapter) for t in prepared.turns])


class LiveModels(Sequence[str]):
    """The names a WebSocket connection may pick (``session.create``'s ``model``): the base model first, then the
    adapters loaded at the time of asking."""

    def __init__(self, selector: AdapterSelector) -> None:
        self.selector = selector

    def __getitem__(self, index: Any) -> Any:
        return self.selector.names()[index]

    def __len__(self) -> int:
        return len(self.selector.names())

    def __contains__(self, name: object) -> bool:
        return name in self.selector.names()

    def __repr__(self) -> str:
        return repr(self.selector.names())
