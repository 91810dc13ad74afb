"""chat.models.tiny.tokenizer: the committed byte-level BPE of the tiny models, and the build that regenerates it."""

from __future__ import annotations

import pytest

from chat.models.tiny.tokenizer import ASSET_DIR, SPECIAL_TOKENS, TEXT, VOCAB_SIZE, build


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(ASSET_DIR), local_files_only=True)


def test_the_build_regenerates_the_committed_files(tmp_path):
    assert build(tmp_path) == tmp_path
    for name in ("tokenizer.json", "tokenizer_config.json"):
        assert (tmp_path / name).read_text() == (ASSET_DIR / name).read_text(), name


def test_vocabulary_and_special_token_ids(tokenizer):
    assert len(tokenizer) == VOCAB_SIZE
    assert tokenizer.convert_tokens_to_ids(SPECIAL_TOKENS) == [0, 1, 2]
    assert tokenizer.eos_token == "<|im_end|>" and tokenizer.pad_token == "<|endoftext|>"
    assert tokenizer.bos_token is None


@pytest.mark.parametrize("text", [TEXT, "zq\x00\x7f ÿ 𝔘 ∰ ﬀ \t\n  x", "never seen: ꙮ 🦜 ⅶ"])
def test_any_text_round_trips(tokenizer, text):
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert all(0 <= i < VOCAB_SIZE for i in ids)
    assert tokenizer.decode(ids, clean_up_tokenization_spaces=False) == text


def test_the_training_text_packs_into_merges(tokenizer):
    ids = tokenizer.encode("The capital of France is Paris.", add_special_tokens=False)
    assert len(ids) < len("The capital of France is Paris.") / 2  # learned merges, not one token a byte


def test_the_chat_template_is_chatml(tokenizer):
    messages = [{"role": "user", "content": "Hi"}]
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert text == "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    assert tokenizer.apply_chat_template(messages, tokenize=False) == "<|im_start|>user\nHi<|im_end|>\n"
