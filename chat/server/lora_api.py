"""LoRA adapters over HTTP: selecting one by a request's ``model``, the model list's adapter entries, and vLLM's
admin routes ``POST /v1/load_lora_adapter`` / ``POST /v1/unload_lora_adapter``.

Selection is one function of the model name any surface calls (:class:`AdapterSelector`): ``select(model)`` gives
the adapter a turn computes under (None for the base model's name, or no name), and :func:`with_adapter` puts it on
the engine's :class:`~chat.engine.events.TurnRequest`; the turn's cache namespace then carries the adapter's
tagged identity (chat/engine/turn.py: ``turn_namespace``).

The routes take vLLM's bodies (``{"lora_name", "lora_path"}``, ``load_inplace`` to replace a loaded name; our
``scale``, as ``--lora NAME=PATH:SCALE``) and answer vLLM's plain-text success lines. Only admin keys may call them
(``--auth-token``'s key, a key flagged admin in the keys file, anyone on an open server): a load reads a path on the
server's disk.
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
from collections.abc import Sequence
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import PlainTextResponse
from pydantic import BaseModel, ConfigDict, Field, field_validator

from chat.engine.events import TurnRequest
from chat.models.errors import AdapterFileError, AdapterMismatchError, UnknownAdapterError
from chat.protocol.errors import ErrorCode
from chat.server.errors import RequestError

NAME_CHARS = 128  # longest adapter name


class LoadLoraRequest(BaseModel):
    """vLLM's ``/v1/load_lora_adapter`` body, plus ``scale``."""

    model_config = ConfigDict(extra="forbid")

    lora_name: str = Field(min_length=1, max_length=NAME_CHARS)
    lora_path: str = Field(min_length=1, max_length=4096)
    load_inplace: bool = False  # replace an adapter already loaded under this name
    scale: float = Field(1.0, description="multiplies the adapter's update (lora_alpha / r and all)")

    @field_validator("lora_name")
    @classmethod
    def _name(cls, value: str) -> str:
        return check_name(value)

    @field_validator("scale")
    @classmethod
    def _scale(cls, value: float) -> float:
        if not math.isfinite(value):
            raise ValueError("must be a finite number")
        return value


class UnloadLoraRequest(BaseModel):
    """vLLM's ``/v1/unload_lora_adapter`` body."""

    model_config = ConfigDict(extra="forbid")

    lora_name: str = Field(min_length=1, max_length=NAME_CHARS)


def check_name(name: str) -> str:
    """An adapter name: printable, no blanks, no ``=`` (``--lora NAME=PATH``). Raises ValueError."""
    if not name or len(name) > NAME_CHARS or any(c.isspace() or c == "=" or not c.isprintable() for c in name):
        raise ValueError(f"an adapter name is 1 to {NAME_CHARS} printable characters without blanks or '='")
    return name


def parse_lora_spec(spec: str) -> tuple[str, str, float]:
    """``NAME=PATH[:SCALE]`` -> ``(name, path, scale)``; a last ``:`` part that is not a number belongs to the path.

    Raises:
        ValueError: no ``=``, an empty path, a bad name or a scale that is not a finite number.
    """
    name, sep, rest = spec.partition("=")
    if not sep or not rest:
        raise ValueError(f"{spec!r}: give NAME=PATH or NAME=PATH:SCALE")
    path, scale = rest, 1.0
    head, colon, tail = rest.rpartition(":")
    if colon and head:
        try:
            scale = float(tail)
            path = head
        except ValueError:
            pass
    if not math.isfinite(scale):
        raise ValueError(f"{spec!r}: the scale must be a finite number")
    return check_name(name), path, scale


class AdapterSelector:
    """Which adapter a model name selects on one runtime. The runtime's adapter bank (``runtime.adapters``) is
    None on models that run on transformers' forward (hybrid recurrent, multimodal): there, only the base model's
    name is served."""

    def __init__(self, runtime: Any, model_name: str) -> None:
        self.bank = getattr(runtime, "adapters", None)  # chat.models.lora.AdapterBank, or None
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


def load_adapters(runtime: Any, specs: Sequence[str], max_loras: int) -> list[Any]:
    """Load ``--lora NAME=PATH[:SCALE]`` specs into ``runtime`` at start (``--max-loras`` resident at once).

    Raises:
        InvalidSettingError: a bad spec, a name given twice, or a model that takes no adapters (``field ==
            "lora"``).
        AdapterFileError, AdapterMismatchError: an adapter that cannot be served on this model.
    """
    from chat.models.errors import InvalidSettingError

    bank = getattr(runtime, "adapters", None)
    if bank is not None:
        bank.max_loras = max_loras
    if not specs:
        return []
    if bank is None:
        raise InvalidSettingError(
            "lora",
            f"{runtime.name} runs on transformers' forward (hybrid recurrent or multimodal); LoRA adapters are "
            "served on the families of turncache's own decoder only",
        )
    loaded = []
    for spec in specs:
        try:
            name, path, scale = parse_lora_spec(spec)
        except ValueError as exc:
            raise InvalidSettingError("lora", str(exc)) from None
        if name == runtime.name or bank.find(name) is not None:
            raise InvalidSettingError("lora", f"{spec}: the name {name!r} is taken")
        adapter = bank.read(name, path, scale)
        bank.add(adapter)
        loaded.append(adapter)
    return loaded


def install_routes(app: FastAPI, selector: AdapterSelector) -> None:
    """``POST /v1/load_lora_adapter`` and ``POST /v1/unload_lora_adapter`` on ``app``."""

    def bank_of(request: Request) -> Any:
        if not request.state.tenant.admin:
            raise RequestError(ErrorCode.UNAUTHORIZED, "loading and unloading LoRA adapters needs an admin key")
        if selector.bank is None:
            message = f"{selector.model_name} runs on transformers' forward: it serves no LoRA adapters"
            raise RequestError(ErrorCode.INVALID_REQUEST, message, param="lora_name")
        return selector.bank

    @app.post("/v1/load_lora_adapter", response_class=PlainTextResponse)
    async def load_lora_adapter(body: LoadLoraRequest, request: Request) -> str:
        bank = bank_of(request)
        if body.lora_name == selector.model_name:
            raise RequestError(
                ErrorCode.INVALID_REQUEST, "an adapter cannot take the base model's name", param="lora_name"
            )
        if bank.find(body.lora_name) is not None and not body.load_inplace:
            message = f"The lora adapter '{body.lora_name}' has already been loaded (load_inplace replaces it)."
            raise RequestError(ErrorCode.INVALID_REQUEST, message, param="lora_name")
        try:
            adapter = await asyncio.to_thread(bank.read, body.lora_name, body.lora_path, body.scale)
        except (AdapterFileError, AdapterMismatchError) as exc:
            raise RequestError(ErrorCode.INVALID_REQUEST, str(exc), param="lora_path") from None
        bank.add(adapter, replace=body.load_inplace)
        return f"Success: LoRA adapter '{body.lora_name}' added successfully."

    @app.post("/v1/unload_lora_adapter", response_class=PlainTextResponse)
    async def unload_lora_adapter(body: UnloadLoraRequest, request: Request) -> str:
        bank = bank_of(request)
        try:
            bank.remove(body.lora_name)
        except UnknownAdapterError:
            message = f"The lora adapter '{body.lora_name}' cannot be found."
            raise RequestError(ErrorCode.NOT_FOUND, message, param="lora_name") from None
        return f"Success: LoRA adapter '{body.lora_name}' removed successfully."
