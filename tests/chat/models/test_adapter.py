"""chat.models.adapter: what every runtime shares (the tokenizer side, the checks of a feed and a run, ``forward``
over ``forward_batch``), here through tiny-llama (the own decoder) and tiny-lfm2 (transformers' forward)."""

from __future__ import annotations

import pytest
import torch

from chat.engine.runtime import Feed
from chat.models import InvalidSettingError, RunStateError
from chat.models.adapter import TextPrompt
from tests.chat.models.helpers import random_tokens, tiny

BOTH = ["tiny-llama", "tiny-lfm2"]


def test_render_applies_the_chatml_template():
    model = tiny("tiny-llama")
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there"}]
    ids = model.render(messages)
    text = model._tokenizer.decode(ids)
    assert (
        text == "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n"
    )
    system = model.render(messages[:1], add_generation_prompt=False)
    assert ids[: len(system)] == system  # the engine relies on this to snapshot at the end of the system prompt
    assert model.eos_token_ids == {model.encode("<|im_end|>")[0]}


def test_runs_refuse_misuse():
    model = tiny("tiny-llama")
    run = model.new_run()
    with pytest.raises(InvalidSettingError, match="token_ids"):
        model.forward(run, [model.vocab_size])
    with pytest.raises(InvalidSettingError, match="token_ids"):
        model.forward(run, [])
    with pytest.raises(RunStateError, match="no tokens"):
        model.export(run)
    model.forward(run, [5, 6])
    model.close_run(run)
    with pytest.raises(RunStateError, match="closed"):
        model.forward(run, [5])
    with pytest.raises(RunStateError, match="not made by"):
        tiny("tiny-mistral").forward(model.new_run(), [5])
    with pytest.raises(InvalidSettingError, match=r"messages\[0\]\.content"):
        model.render([{"role": "user", "content": [{"type": "text", "text": "hi"}]}])


def test_a_forward_past_the_context_window_is_refused():
    model = tiny("tiny-llama")
    run = model.new_run()
    with pytest.raises(RunStateError, match="context window"):
        model.forward(run, [5] * (model.context_window + 1))


@pytest.mark.parametrize("spec", BOTH)
def test_a_feed_asks_for_logits_of_zero_to_all_its_tokens(spec):
    model = tiny(spec)
    run = model.new_run()
    try:
        for bad in (-1, 3, 1.0, None):
            (outcome,) = model.forward_batch([Feed(run, [5, 6], bad)])
            assert isinstance(outcome, InvalidSettingError) and outcome.field == "logits", bad
        assert run.length == 0  # a refused feed absorbs nothing
        with pytest.raises(InvalidSettingError, match="token_ids"):
            model.forward(run, [-1])
        (none,) = model.forward_batch([Feed(run, [5, 6], 0)])
        assert none is None and run.length == 2  # no logits asked: the tokens are still absorbed
    finally:
        model.close_run(run)


@pytest.mark.parametrize("spec", BOTH)
def test_last_only_is_the_last_row_of_the_full_logits(spec):
    model = tiny(spec)
    tokens = random_tokens(model, 9, seed=3)
    runs = [model.new_run(), model.new_run()]
    try:
        full = model.forward(runs[0], tokens)
        last = model.forward(runs[1], tokens, last_only=True)
    finally:
        for run in runs:
            model.close_run(run)
    assert full.shape == (9, model.vocab_size) and full.dtype == torch.float32
    assert last.shape == (1, model.vocab_size)
    assert torch.allclose(last, full[-1:], atol=1e-5)


def test_a_broken_run_is_refused_until_replaced():
    model = tiny("tiny-llama")
    run = model.new_run()
    try:
        run.broken = True  # what a forward that failed half-way leaves
        with pytest.raises(RunStateError, match="inconsistent"):
            model.forward(run, [5])
        with pytest.raises(RunStateError, match="inconsistent"):
            model.extras(run)
    finally:
        model.close_run(run)


def test_text_models_have_no_extras_and_no_media():
    model = tiny("tiny-llama")
    run = model.new_run()
    try:
        assert model.extras(run) == ()
    finally:
        model.close_run(run)
    assert model.modalities == frozenset() and not model.whole_media_spans
    assert model.dtype == model.kv_dtype
    prompt = model.render_prompt([{"role": "user", "content": "Hi there"}])
    assert isinstance(prompt, TextPrompt) and prompt.spans == ()
    assert list(prompt.tokens) == model.render([{"role": "user", "content": "Hi there"}])


def test_encode_decode_and_token_bytes():
    model = tiny("tiny-llama")
    assert model.encode("<|im_end|>") == [2]  # special tokens in the text are the special token
    assert model.decode([*model.encode("café"), 2]) == "café"  # special tokens left out
    assert model.encode_prompt("café") == model.encode("café")  # ChatML: nothing put around a prompt
    assert b"".join(model.token_bytes(t) for t in model.encode("naïve 🙂")) == "naïve 🙂".encode()
    detok = model.detokenizer()
    assert detok is not model.detokenizer()  # one per reply
