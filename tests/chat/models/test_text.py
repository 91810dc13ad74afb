"""Chat template rendering, decoding, incremental detokenization and fingerprints of the tiny models."""

from __future__ import annotations

from chat.models.detokenizer import REPLACEMENT, IncrementalDetokenizer
from tests.chat.models.helpers import ALL_TINY, tiny

TEXT = "Voilà: 漢字 and 𝄞 music, ñ, Привет 🙂 done."


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


def test_detokenizer_never_emits_half_a_character():
    model = tiny("tiny-llama")
    ids = model.encode(TEXT)
    assert len(ids) > len(TEXT) / 2, "the tiny tokenizer should split rare characters into byte tokens"
    detok = model.detokenizer()
    deltas = [detok.push(t) for t in ids]
    assert not any(REPLACEMENT in d for d in deltas)
    assert "".join(deltas) + detok.flush() == TEXT
    assert "" in deltas  # some tokens completed no character


def test_detokenizer_flushes_an_incomplete_tail_and_skips_special_tokens():
    model = tiny("tiny-llama")
    ids = model.encode("ok 𝄞")
    detok = model.detokenizer()
    out = "".join(detok.push(t) for t in [*ids[:-1], 1])  # the last byte of 𝄞 never comes; <|im_start|> is special
    assert out == "ok "
    assert detok.flush() == REPLACEMENT


def test_detokenizer_with_a_leading_space_dropping_decoder():
    pieces = {1: "▁Hello", 2: "▁world", 3: "!"}

    def decode(ids):  # SentencePiece style: the first piece loses its leading space
        return "".join(pieces[i] for i in ids).replace("▁", " ").removeprefix(" ")

    detok = IncrementalDetokenizer(decode)
    assert [detok.push(i) for i in (1, 2, 3)] == ["Hello", " world", "!"]


def test_fingerprints_differ_between_models_and_are_stable():
    prints = {spec: tiny(spec).fingerprint for spec in ALL_TINY}
    assert len(set(prints.values())) == len(ALL_TINY)
    assert all(p.startswith(spec + "@") for spec, p in prints.items())
    from chat.models import load_model

    assert load_model("tiny-llama").fingerprint == prints["tiny-llama"]  # same seed, same weights
