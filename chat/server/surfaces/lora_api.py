"""LoRA adapters in: ``--lora NAME=PATH[:SCALE]`` at start (:func:`load_adapters`) and vLLM's admin routes
``POST /v1/load_lora_adapter`` / ``POST /v1/unload_lora_adapter``. Which adapter a request's ``model`` selects is
the reply pipeline's admission (``chat.server.reply.adapters``).

The routes take vLLM's bodies (``{"lora_name", "lora_path"}``, ``load_inplace`` to replace a loaded name; our
``scale``, as ``--lora NAME=PATH:SCALE``) and answer vLLM's plain-text success lines. Only admin keys may call them
(``--auth-token``'s key, a key flagged admin in the keys file, anyone on an open server): a load reads a path on the
server's disk.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Sequence
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import PlainTextResponse
from pydantic import BaseModel, ConfigDict, Field, field_validator

from chat.models.errors import AdapterFileError, AdapterMismatchError, UnknownAdapterError
from chat.protocol.errors import ErrorCode
from chat.server.errors import RequestError
from chat.server.reply.adapters import AdapterSelector

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
