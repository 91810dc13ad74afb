"""chat.models.detokenizer: text deltas from a token stream, never half a character, whatever the tokenizer."""

from __future__ import annotations

from chat.models.detokenizer import REPLACEMENT, IncrementalDetokenizer
from tests.chat.models.helpers import tiny

TEXT = "Voilà: 漢字 and 𝄞 music, ñ, Привет 🙂 done."


def byte_decode(ids):
    """A byte-level tokenizer's decode: each id is one byte; an incomplete character decodes as U+FFFD."""
    return bytes(ids).decode("utf-8", errors="replace")


def test_a_character_split_over_byte_tokens_comes_out_whole_once_complete():
    detok = IncrementalDetokenizer(byte_decode)
    deltas = [detok.push(b) for b in "a€b".encode()]  # € is three bytes
    assert deltas == ["a", "", "", "€", "b"]
    assert detok.flush() == ""


def test_flush_releases_an_incomplete_tail_as_the_replacement_character():
    detok = IncrementalDetokenizer(byte_decode)
    head = [detok.push(b) for b in "x🙂".encode()[:-1]]  # the emoji's last byte never comes
    assert head == ["x", "", "", ""]
    assert detok.flush() == REPLACEMENT
    assert detok.flush() == ""  # nothing held any more


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
