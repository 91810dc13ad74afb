"""Tools on the wire, as in OpenAI's chat completions: function definitions (``tools``), ``tool_choice``, and the
calls an assistant message carries (``tool_calls``). How a model is told about them and how its calls are read back
is ``chat.engine.tool_calls``; ``docs/openai.md`` says how they meet the cache.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field

from chat.protocol.base import WireModel

MAX_TOOLS = 128  # functions in one request
MAX_TOOL_CALLS = 128  # calls in one assistant message
MAX_TOOL_DESCRIPTION = 65_536  # characters of one tool's description (Claude Code 2.1.197's Workflow tool has 18,780)
FunctionName = Annotated[str, Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")]


class FunctionDef(WireModel):
    name: FunctionName
    description: Annotated[str, Field(max_length=MAX_TOOL_DESCRIPTION)] | None = None
    parameters: dict[str, Any] | None = None  # JSON schema of the arguments object (None: any object)
    strict: bool | None = None  # refuse schema keywords the decoder cannot enforce (calls are always constrained)


class ToolDef(WireModel):
    type: Literal["function"]
    function: FunctionDef


class NamedFunction(WireModel):
    name: FunctionName


class NamedToolChoice(WireModel):
    type: Literal["function"]
    function: NamedFunction


ToolChoiceWire = Literal["none", "auto", "required"] | NamedToolChoice


class CallFunction(WireModel):
    name: FunctionName
    arguments: Annotated[str, Field(max_length=262_144)]  # JSON text of the arguments object


class AssistantToolCall(WireModel):
    id: Annotated[str, Field(min_length=1, max_length=128)]
    type: Literal["function"] = "function"
    function: CallFunction
