"""chat.engine.errors: each error's message says what a user can act on and keeps the fields the server's error
table reads; every one is an EngineError, and the ones about a request are ValueErrors too."""

from __future__ import annotations

import pytest

from chat.engine.errors import (
    ChatTemplateError,
    ContextOverflowError,
    EngineClosedError,
    EngineError,
    InvalidBatchSettingError,
    InvalidMediaError,
    NoChatTemplateError,
    UnsupportedMediaError,
)


def test_a_context_overflow_names_both_sizes():
    error = ContextOverflowError(9000, 8192)
    assert (error.prompt_tokens, error.context_window) == (9000, 8192)
    assert str(error).startswith("the prompt has 9000 tokens; the model's context window is 8192")


def test_a_batch_setting_and_media_errors_name_what_they_refuse():
    assert InvalidBatchSettingError("max_batch", "must be at least 1").field == "max_batch"
    assert str(InvalidBatchSettingError("max_batch", "must be at least 1")) == "max_batch: must be at least 1"
    unsupported = UnsupportedMediaError("messages[1].content[0]", "audio", "smollm2")
    assert (unsupported.item, unsupported.kind) == ("messages[1].content[0]", "audio")
    assert str(unsupported) == "messages[1].content[0]: the model 'smollm2' does not accept audio input"
    invalid = InvalidMediaError("messages[0].content[2]", "not a PNG, JPEG, GIF or WebP image")
    assert (invalid.item, str(invalid)) == ("messages[0].content[2]", "not a PNG, JPEG, GIF or WebP image")


def test_template_errors_point_at_the_way_out_and_the_line():
    base = NoChatTemplateError("gemma-3-270m")
    assert base.model == "gemma-3-270m" and "--chat-template" in str(base) and "/v1/completions" in str(base)
    assert str(ChatTemplateError("undefined 'x'", 7)) == "the chat template failed at line 7: undefined 'x'"
    unplaced = ChatTemplateError("no tools here")
    assert (unplaced.line, str(unplaced)) == (None, "the chat template failed: no tools here")


@pytest.mark.parametrize(
    "error",
    [
        InvalidBatchSettingError("f", "m"),
        ContextOverflowError(2, 1),
        UnsupportedMediaError("i", "image", "m"),
        InvalidMediaError("i", "m"),
        NoChatTemplateError("m"),
        ChatTemplateError("p"),
    ],
)
def test_errors_about_a_request_are_value_errors_of_the_engine(error):
    assert isinstance(error, EngineError) and isinstance(error, ValueError)


def test_a_closed_engine_is_not_the_requests_fault():
    assert isinstance(EngineClosedError(), EngineError) and not isinstance(EngineClosedError(), ValueError)
