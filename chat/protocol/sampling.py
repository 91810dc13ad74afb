"""Sampling settings: the only place their ranges are checked, for both transports (the WebSocket events and the
HTTP API's sampling fields, ``chat/server/surfaces/openai_api.py``). The engine's ``SamplingParams`` does not check them
again; ``chat.server.reply.turns.sampling_params`` converts, filling fields left out (``None``) from the model's
``generation_config``, else OpenAI's documented defaults (temperature 1, top_p 1), and ``max_tokens`` with the room
left in the context window (a server setting may cap it).

Structured output travels here too: ``response_format`` (OpenAI's ``json_object`` / ``json_schema``) and
``structured_outputs`` (an extension, as vLLM names it: ``json``, ``regex``, ``grammar`` (Lark or GBNF), ``choice``).
At most one of the two constrains a reply.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, ConfigDict, Field, field_validator, model_validator
from pydantic_core import PydanticCustomError

from chat.protocol.base import WireModel
from chat.protocol.limits import (
    MAX_GRAMMAR_CHARS,
    MAX_LOGIT_BIAS,
    MAX_PRIORITY,
    MAX_REPETITION_PENALTY,
    MAX_REPLY_TOKENS,
    MAX_SEED,
    MAX_STOP_CHARS,
    MAX_STOP_STRINGS,
    MAX_TEMPERATURE,
    MAX_TOP_K,
    MAX_TOP_LOGPROBS,
)


def _one_or_many(value: Any) -> Any:
    return [value] if isinstance(value, str) else value  # OpenAI accepts "stop": "x" as well as a list


StopString = Annotated[str, Field(min_length=1, max_length=MAX_STOP_CHARS)]
Penalty = Annotated[float, Field(ge=-2.0, le=2.0)]
GrammarText = Annotated[str, Field(min_length=1, max_length=MAX_GRAMMAR_CHARS)]


class JsonSchemaFormat(WireModel):
    """``response_format.json_schema``: the reply is JSON valid for ``schema`` (always, strict or not; ``strict``
    also refuses a schema with keywords the decoder cannot enforce, instead of ignoring them)."""

    name: Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_-]+$")]
    description: str | None = None  # for the client's own records (OpenAI's model reads it; this decoder does not)
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")  # None: any JSON value
    strict: bool | None = None

    model_config = ConfigDict(
        extra="forbid", frozen=True, allow_inf_nan=False, populate_by_name=True, serialize_by_alias=True
    )


class ResponseFormat(WireModel):
    """OpenAI's ``response_format``: ``text`` (free), ``json_object`` (any JSON object) or ``json_schema``."""

    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None

    @model_validator(mode="after")
    def _schema_iff_json_schema(self) -> ResponseFormat:
        if (self.type == "json_schema") != (self.json_schema is not None):
            message = "json_schema is required with (and only with) type json_schema"
            raise PydanticCustomError("response_format", message)
        return self


class StructuredOutputs(WireModel):
    """An extension (vLLM's ``structured_outputs``): exactly one of ``json`` (a JSON schema), ``json_object``,
    ``regex``, ``grammar`` (Lark, or GBNF when it holds ``::=``), ``choice`` (the reply is one of these strings)."""

    json_: dict[str, Any] | None = Field(default=None, alias="json")
    json_object: bool | None = None
    regex: GrammarText | None = None
    grammar: GrammarText | None = None
    choice: Annotated[list[Annotated[str, Field(min_length=1)]], Field(min_length=1, max_length=1024)] | None = None

    model_config = ConfigDict(
        extra="forbid", frozen=True, allow_inf_nan=False, populate_by_name=True, serialize_by_alias=True
    )

    @model_validator(mode="after")
    def _exactly_one(self) -> StructuredOutputs:
        given = [n for n in ("json_", "regex", "grammar", "choice") if getattr(self, n) is not None]
        given += ["json_object"] if self.json_object else []
        if len(given) != 1:
            message = "give exactly one of json, json_object, regex, grammar, choice"
            raise PydanticCustomError("structured_outputs", message)
        return self


class SamplingSettings(WireModel):
    """How replies are sampled. Every field is optional on the wire; ``None`` takes the model's default (see the
    module docstring).

    In ``session.update`` only the fields the client sent change (see ``model_fields_set``).
    """

    temperature: Annotated[float, Field(ge=0.0, le=MAX_TEMPERATURE)] | None = None  # 0 = greedy
    top_p: Annotated[float, Field(gt=0.0, le=1.0)] | None = None  # nucleus mass kept
    top_k: Annotated[int, Field(ge=0, le=MAX_TOP_K)] | None = None  # 0 = no limit
    min_p: Annotated[float, Field(ge=0.0, le=1.0)] | None = None  # drop tokens under min_p x the best one's prob
    seed: Annotated[int, Field(ge=0, le=MAX_SEED)] | None = None  # None = nondeterministic
    max_tokens: Annotated[int, Field(ge=1, le=MAX_REPLY_TOKENS)] | None = None  # None: up to the context's end
    stop: Annotated[list[StopString], Field(max_length=MAX_STOP_STRINGS), BeforeValidator(_one_or_many)] | None = None
    presence_penalty: Penalty | None = None  # OpenAI's; applied to the reply's tokens
    frequency_penalty: Penalty | None = None  # OpenAI's; per occurrence in the reply
    repetition_penalty: Annotated[float, Field(gt=0.0, le=MAX_REPETITION_PENALTY)] | None = None  # 1 = off
    logit_bias: (
        Annotated[dict[str, Annotated[float, Field(ge=-100.0, le=100.0)]], Field(max_length=MAX_LOGIT_BIAS)] | None
    ) = None
    logprobs: bool | None = None  # report each reply token's log-probability
    top_logprobs: Annotated[int, Field(ge=0, le=MAX_TOP_LOGPROBS)] | None = None  # ... and this many alternatives
    response_format: ResponseFormat | None = None
    structured_outputs: StructuredOutputs | None = None
    # scheduling, not sampling (vLLM's field): lower is served sooner; None: the tenant's default
    priority: Annotated[int, Field(ge=-MAX_PRIORITY, le=MAX_PRIORITY)] | None = None

    @field_validator("logit_bias")
    @classmethod
    def _token_ids(cls, value: dict[str, float] | None) -> dict[str, float] | None:
        for key in value or {}:
            if not key.isdigit():
                raise PydanticCustomError("logit_bias", "logit_bias keys are token ids (non-negative integers)")
        return value

    @model_validator(mode="after")
    def _consistent(self) -> SamplingSettings:
        if self.top_logprobs and not self.logprobs:
            raise PydanticCustomError("top_logprobs", "top_logprobs needs logprobs: true")
        constrained = self.response_format is not None and self.response_format.type != "text"
        if constrained and self.structured_outputs is not None:
            raise PydanticCustomError("structured_outputs", "give response_format or structured_outputs, not both")
        return self

    def merged(self, update: SamplingSettings) -> SamplingSettings:
        """These settings with the fields that ``update`` was given explicitly replaced."""
        return self.model_copy(update={name: getattr(update, name) for name in update.model_fields_set})
