"""The base of every wire type: closed (unknown fields are refused), immutable, no NaN or infinity."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class WireModel(BaseModel):
    """A JSON object on the wire. Client frames are validated in strict mode (``"1"`` is not a number)."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)
