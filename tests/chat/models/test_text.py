"""Chat template rendering, decoding, incremental detokenization and fingerprints of the tiny models."""

from __future__ import annotations

from tests.chat.models.helpers import ALL_TINY, tiny


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


def test_fingerprints_differ_between_models_and_are_stable():
    prints = {spec: tiny(spec).fingerprint for spec in ALL_TINY}
    assert len(set(prints.values())) == len(ALL_TINY)
    assert all(p.startswith(spec + "@") for spec, p in prints.items())
    from chat.models import load_model

    assert load_model("tiny-llama").fingerprint == prints["tiny-llama"]  # same seed, same weights
