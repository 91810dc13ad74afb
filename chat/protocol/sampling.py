"""Sampling settings: the only place their ranges are checked, for both transports (the WebSocket events and the
HTTP API's sampling fields, ``chat/server/openai_api.py``). The engine's ``SamplingParams`` does not check them
again; ``chat.server.turns.sampling_params`` converts. The defaults equal the engine's.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BeforeValidator, Field

from chat.protocol.base import WireModel
from chat.protocol.limits import (
    MAX_REPLY_TOKENS,
    MAX_SEED,
    MAX_STOP_CHARS,
    MAX_STOP_STRINGS,
    MAX_TEMPERATURE,
    MAX_TOP_K,
)


def _one_or_many(value: Any) -> Any:
    return [value] if isinstance(value, str) else value  # OpenAI accepts "stop": "x" as well as a list


StopString = Annotated[str, Field(min_length=1, max_length=MAX_STOP_CHARS)]


class SamplingSettings(WireModel):
    """How replies are sampled. Every field is optional on the wire; missing fields take the defaults below.

    In ``session.update`` only the fields the client sent change (see ``model_fields_set``).
    """

    temperature: Annotated[float, Field(ge=0.0, le=MAX_TEMPERATURE)] = 0.0  # 0 = greedy
    top_p: Annotated[float, Field(gt=0.0, le=1.0)] = 1.0  # nucleus mass kept
    top_k: Annotated[int, Field(ge=0, le=MAX_TOP_K)] = 0  # 0 = no limit
    seed: Annotated[int, Field(ge=0, le=MAX_SEED)] | None = None  # None = nondeterministic
    max_tokens: Annotated[int, Field(ge=1, le=MAX_REPLY_TOKENS)] = 256  # reply length cap
    stop: Annotated[list[StopString], Field(max_length=MAX_STOP_STRINGS), BeforeValidator(_one_or_many)] = Field(
        default_factory=list
    )  # strings that end the reply (not included in it)

    def merged(self, update: SamplingSettings) -> SamplingSettings:
        """These settings with the fields that ``update`` was given explicitly replaced."""
        return self.model_copy(update={name: getattr(update, name) for name in update.model_fields_set})
