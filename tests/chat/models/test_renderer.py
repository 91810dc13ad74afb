"""chat.models.renderer: a TemplateRenderer holds a tokenizer and its template, never weights, and refuses messages
that are not text as the adapter refuses them (it is built by ``load_renderer``: test_renderer_loading.py)."""

from __future__ import annotations

import pytest
import torch

from chat.models import InvalidSettingError, load_renderer
from tests.chat.models.helpers import tiny


def test_a_renderer_holds_no_weights():
    renderer = load_renderer("tiny-omni")
    held = vars(renderer).values()
    assert not any(isinstance(v, torch.nn.Module | torch.Tensor) for v in held)


def test_messages_that_are_not_text_are_refused_as_the_adapter_refuses_them():
    renderer, adapter = load_renderer("tiny-llama"), tiny("tiny-llama")
    for bad, field in [
        ([{"role": "user", "content": None}], "messages[0].content"),
        ([{"content": "x"}], "messages[0].role"),
    ]:
        for model in (renderer, adapter):
            with pytest.raises(InvalidSettingError) as info:
                model.render(bad)
            assert info.value.field == field
