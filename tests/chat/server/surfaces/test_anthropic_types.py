"""Anthropic's wire models (``chat/server/surfaces/anthropic_types.py``): unknown fields and non-finite numbers
refused, a breakpoint's TTL in seconds, and how many turns a clear-thinking edit keeps."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from chat.server.surfaces import anthropic_types as wire

BODY = {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]}


def test_a_breakpoints_ttl_is_5_minutes_unless_1_hour():
    assert wire.CacheControl(type="ephemeral").ttl_s == 300
    assert wire.CacheControl(type="ephemeral", ttl="5m").ttl_s == 300
    assert wire.CacheControl(type="ephemeral", ttl="1h").ttl_s == 3600


@pytest.mark.parametrize(
    ("keep", "kept"),
    [(None, 1), ("all", None), ({"type": "all"}, None), ({"type": "thinking_turns", "value": 3}, 3)],
)
def test_a_clear_thinking_edit_keeps_the_last_turn_by_default(keep, kept):
    edit = wire.ClearThinkingEdit.model_validate({"type": "clear_thinking_20251015", "keep": keep})
    assert edit.turns_kept() == kept


@pytest.mark.parametrize("extra", [{"frobnicate": 1}, {"temperature": float("nan")}, {"top_p": float("inf")}])
def test_unknown_fields_and_non_finite_numbers_are_refused(extra):
    wire.MessagesRequest.model_validate(BODY)
    with pytest.raises(ValidationError):
        wire.MessagesRequest.model_validate({**BODY, **extra})
