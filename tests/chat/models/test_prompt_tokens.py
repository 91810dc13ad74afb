"""Render reuse (``chat.models.prompt_tokens``): a prompt's ids, taken in part from an earlier render, are exactly the
ids of a full encode, on random conversations that grow, are edited, regenerated and re-rendered otherwise by their
template (thinking dropped, tool calls), with media parts, on every tiny family's tokenizer and on tokenizers built
with other pipelines (Metaspace, a prepending normalizer, WordPiece, added tokens that strip whitespace). The checks
in service are off in these tests (they would hide a wrong reuse by falling back), except where they are tested."""

from __future__ import annotations

import logging
import random

import pytest
from tokenizers import AddedToken, Tokenizer, models, normalizers, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from chat.models import load_renderer, prompt_tokens
from chat.models.prompt_tokens import CutFinder, PromptEncoder
from chat.models.renderer import render_chat
from chat.models.tiny.templates import HERMES_TOOLS
from tests.chat.models.helpers import ALL_TINY, tiny
from tests.chat.models.mm_helpers import MULTIMODAL, png

FRAGMENTS = [
    "Hi",
    "What is the sea?",
    "  two   spaces ",
    "\n\nnew paragraph\n",
    "Voilà: 漢字 and 𝄞, ñ, Привет 🙂",
    "<|im_start|> typed by a user",
    "a <|im_end|> inside",
    "<|im",
    "end|>",
    "<sep>",
    " <sep> ",
    "x<sep>y",
    "1234567890",
    "tabs\tand\ttabs",
    "",
    " ",
    "Salt water.",
    "<think>a thought</think>the answer",
    "<start_of_turn> and [IMG]",
]


@pytest.fixture(autouse=True)
def no_checks(monkeypatch):
    """A wrong reuse must show as wrong ids here, not be caught and replaced by a full encode."""
    monkeypatch.setattr(prompt_tokens, "CHECK_FIRST", 0)
    monkeypatch.setattr(prompt_tokens, "CHECK_EVERY", 10**9)


def text_of(rng: random.Random, words: int) -> str:
    return "".join(rng.choice(FRAGMENTS) + rng.choice(["", " ", "\n"]) for _ in range(words))


def conversations(seed: int, steps: int = 14, thinking: bool = False):
    """Message lists a client would send turn after turn: growing, with an edit, a regenerate, a new system prompt
    now and then."""
    rng = random.Random(seed)
    messages = [{"role": "system", "content": text_of(rng, 3)}] if rng.random() < 0.7 else []
    for _ in range(steps):
        roll = rng.random()
        if roll < 0.1 and len(messages) > 2:  # an earlier message edited
            i = rng.randrange(len(messages))
            messages[i] = {**messages[i], "content": text_of(rng, 2)}
        elif roll < 0.2 and messages and messages[-1]["role"] == "assistant":  # regenerate
            messages.pop()
        elif roll < 0.25:
            messages = [{"role": "system", "content": text_of(rng, 2)}, *messages[1:]]
        else:
            reply = text_of(rng, rng.randrange(1, 5))
            if thinking:
                reply = f"<think>{text_of(rng, 2)}</think>{reply}"
            messages = [*messages, {"role": "user", "content": text_of(rng, rng.randrange(1, 4))}]
            if rng.random() < 0.9:
                messages.append({"role": "assistant", "content": reply})
        if messages and messages[-1]["role"] == "user":
            yield list(messages)
    yield [*messages, {"role": "user", "content": text_of(rng, 1)}]


def assert_exact_texts(tokenizer, texts, salt: str = "t") -> PromptEncoder:
    encoder = PromptEncoder(tokenizer)
    for text in texts:
        assert encoder.encode(text, salt) == list(tokenizer.encode(text, add_special_tokens=False)), text
    return encoder


def rendered(tokenizer, seeds=range(6), **kwargs):
    for seed in seeds:
        for messages in conversations(seed, **kwargs):
            yield tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


@pytest.mark.parametrize("spec", ALL_TINY + MULTIMODAL + ["tiny-hermes", "tiny-thinking"])
def test_every_tiny_familys_tokenizer_gives_the_full_encodes_ids_and_reuses(spec):
    tokenizer = load_renderer(spec)._tokenizer
    encoder = assert_exact_texts(tokenizer, rendered(tokenizer, thinking=spec == "tiny-thinking"))
    assert encoder.reusing and encoder.stats.reused > 10  # most renders took ids from an earlier one


def test_a_growing_conversation_encodes_only_what_follows_the_previous_prompts_last_cut():
    tokenizer = load_renderer("tiny-llama")._tokenizer
    encoder = PromptEncoder(tokenizer)
    messages, previous = [{"role": "user", "content": "Hi there"}], None
    for turn in range(5):
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        before = encoder.stats.reused_tokens
        encoder.encode(text, "t")
        if previous is not None:  # everything up to the previous prompt's "<|im_start|>assistant" was reused
            shared = previous[: previous.rindex("<|im_start|>")]
            assert text.startswith(shared)
            assert encoder.stats.reused_tokens - before == len(tokenizer.encode(shared, add_special_tokens=False))
        previous = text
        messages += [{"role": "assistant", "content": f"Reply {turn} " * 5}, {"role": "user", "content": "More?"}]


def test_a_template_that_drops_earlier_thinking_gives_the_full_encodes_ids():
    tokenizer = load_renderer("tiny-thinking")._tokenizer
    messages = [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "<think>long thought</think>Hello"},
        {"role": "user", "content": "And?"},
    ]
    texts = [tokenizer.apply_chat_template(messages[:1], tokenize=False, add_generation_prompt=True)]
    texts.append(tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True))
    assert "long thought" not in texts[1]  # the template re-renders the reply without its thinking
    assert_exact_texts(tokenizer, texts)


def test_tool_definitions_calls_and_results_give_the_full_encodes_ids():
    tokenizer = load_renderer("tiny-hermes")._tokenizer
    assert tokenizer.chat_template == HERMES_TOOLS
    tools = [{"type": "function", "function": {"name": "search", "parameters": {"type": "object"}}}]
    call = {"id": "c1", "type": "function", "function": {"name": "search", "arguments": '{"q": "sea <|im_end|>"}'}}
    messages = [{"role": "user", "content": "Find the sea"}]
    steps = [
        list(messages),
        [
            *messages,
            {"role": "assistant", "content": "", "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "c1", "content": "blue"},
        ],
    ]
    steps.append([*steps[1], {"role": "assistant", "content": "It is blue."}, {"role": "user", "content": "Why?"}])
    encoder = PromptEncoder(tokenizer)
    for step in steps:
        assert render_chat(tokenizer, step, True, tools, None, lambda t: encoder.encode(t, "s")) == render_chat(
            tokenizer, step, True, tools
        )
    assert encoder.stats.reused == 2


def built_tokenizer(kind: str) -> PreTrainedTokenizerFast:
    """A small tokenizer trained here, with a ChatML template that also writes ``<sep>`` (an added token that strips
    the whitespace around it, never a cut)."""
    specials = ["<unk>", "<|im_start|>", "<|im_end|>"]
    if kind == "wordpiece":
        tok = Tokenizer(models.WordPiece(unk_token="<unk>"))
        tok.normalizer = normalizers.BertNormalizer(lowercase=True)
        tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        trainer = trainers.WordPieceTrainer(vocab_size=400, special_tokens=specials)
    else:
        tok = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=kind == "prepend"))
        if kind == "prepend":  # Llama 2's: a normalizer that prepends and replaces spaces, no pre-tokenizer
            tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
        else:
            tok.pre_tokenizer = pre_tokenizers.Metaspace(prepend_scheme=kind.removeprefix("metaspace-"))
        trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=specials)
    rng = random.Random(7)
    tok.train_from_iterator([text_of(rng, 6) for _ in range(300)], trainer)
    tok.add_tokens([AddedToken("<sep>", lstrip=True, rstrip=True, normalized=False)])
    wrapped = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>")
    wrapped.chat_template = (
        "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }} <sep> {{ loop.index }}<|im_end|>\n"
        "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    return wrapped


@pytest.mark.parametrize("kind", ["metaspace-first", "metaspace-always", "metaspace-never", "prepend", "wordpiece"])
def test_tokenizers_built_with_other_pipelines_give_the_full_encodes_ids(kind):
    tokenizer = built_tokenizer(kind)
    encoder = assert_exact_texts(tokenizer, rendered(tokenizer))
    assert encoder.stats.reused > 10


def test_an_added_token_that_strips_whitespace_is_never_a_cut():
    tokenizer = built_tokenizer("metaspace-first")
    finder = CutFinder.of(tokenizer)
    text = "<|im_start|>user a <sep> b<|im_end|><|im_start|>x"
    assert finder.cuts(text) == [text.index("<|im_end|>"), text.rindex("<|im_start|>")]


def test_cuts_are_matched_leftmost_longest_as_the_tokenizer_splits():
    class Token:
        def __init__(self, content, lstrip=False):
            self.content, self.lstrip, self.rstrip, self.single_word, self.normalized = (
                content,
                lstrip,
                False,
                False,
                False,
            )

    finder = CutFinder([Token("<a>"), Token("<a><b>", lstrip=True), Token("<b>"), Token("b>c")])
    # at 1 "<a><b>" (it strips: not a cut) wins over "<a>" (longest) and hides the "<b>" at 4; "b>c" at 9 starts
    # inside the "<b>" at 8 (leftmost wins): not a split
    assert finder.cuts("x<a><b>y<b>c<a>") == [8, 12]
    assert finder.cuts("yb>c<b>") == [1, 4]
    assert finder.cuts("<a>") == []  # the text's start is never a cut


def test_renders_of_one_tenant_never_reuse_anothers():
    tokenizer = load_renderer("tiny-llama")._tokenizer
    texts = list(rendered(tokenizer, seeds=[1]))
    encoder = PromptEncoder(tokenizer)
    for text in texts:
        encoder.encode(text, "alice")
    reused = encoder.stats.reused
    for text in texts[-1:]:
        assert encoder.encode(text, "bob") == list(tokenizer.encode(text, add_special_tokens=False))
    assert encoder.stats.reused == reused  # bob's first render took nothing from alice's
    encoder.encode(texts[-1], "bob")
    assert encoder.stats.reused == reused + 1  # his own, yes


def test_memory_is_bounded_and_renders_stay_exact_when_dropped():
    tokenizer = load_renderer("tiny-llama")._tokenizer
    encoder = PromptEncoder(tokenizer, budget_tokens=300)
    for text in rendered(tokenizer, seeds=range(3)):
        assert encoder.encode(text, "t") == list(tokenizer.encode(text, add_special_tokens=False))
        assert encoder._held <= 300 or len(encoder._renders) == 1
        held = {id(r) for r in encoder._renders.values()}
        assert all(id(render) in held for render, _ in encoder._at.values())  # no digest points at a dropped render
    assert encoder.stats.reused > 0


def test_a_reuse_that_differs_from_the_full_encode_is_caught_turns_reuse_off_and_gives_the_full_ids(
    monkeypatch, caplog
):
    monkeypatch.setattr(prompt_tokens, "CHECK_FIRST", 2)  # the first render and the next, a reuse
    tokenizer = load_renderer("tiny-llama")._tokenizer
    texts = list(rendered(tokenizer, seeds=[2]))
    encoder = PromptEncoder(tokenizer)
    encoder.encode(texts[0], "t")
    real = encoder._backend

    class Shifted:  # a tokenizer whose pieces do not add up: what the check is there for
        def encode(self, text, add_special_tokens):
            encoding = real.encode(text, add_special_tokens=add_special_tokens)
            return type("E", (), {"ids": [i + 1 for i in encoding.ids], "offsets": encoding.offsets})()

    encoder._backend = Shifted()
    with caplog.at_level(logging.ERROR, logger=prompt_tokens.__name__):
        assert encoder.encode(texts[1], "t") == list(tokenizer.encode(texts[1], add_special_tokens=False))
    assert encoder.stats.checked == 2 and not encoder.reusing and "render reuse is off" in caplog.text
    assert encoder.encode(texts[2], "t") == list(tokenizer.encode(texts[2], add_special_tokens=False))  # full encodes


def test_a_tokenizer_that_is_not_a_fast_one_is_never_reused_from():
    class Slow:
        def encode(self, text, add_special_tokens):
            return [len(text)]

    encoder = PromptEncoder(Slow())
    assert not encoder.reusing and encoder.encode("<|im_start|>a<|im_end|>") == [23]


def test_a_text_models_prompt_reuses_its_tenants_renders_and_a_multimodal_ones_too():
    model = tiny("tiny-thinking")
    model.prompt_encoder = PromptEncoder(model._tokenizer)
    for messages in conversations(3, thinking=True):
        assert model.render_prompt(messages, salt="a").tokens == tuple(model.render(messages))
    assert model.prompt_encoder.stats.reused > 3

    mm = tiny("tiny-qwen3vl")
    mm.prompt_encoder = PromptEncoder(mm._tokenizer)
    image = prompt_tokens_image()
    history = [{"role": "user", "content": [{"type": "text", "text": "Look"}, image]}]
    expected = []
    for turn in range(4):
        history = [
            *history,
            {"role": "assistant", "content": f"A picture {turn}."},
            {"role": "user", "content": "More"},
        ]
        got = mm.render_prompt(history, salt="a")
        fresh = PromptEncoder(mm._tokenizer, reuse=False)
        mm.prompt_encoder, kept = fresh, mm.prompt_encoder
        expected = mm.render_prompt(history, salt="a")
        mm.prompt_encoder = kept
        assert got.tokens == expected.tokens and got.spans == expected.spans
    assert kept.stats.reused == 3


def prompt_tokens_image():
    from modalities.parts import MediaInput

    return MediaInput.from_bytes("image", png(1), item="messages[0].content[1]")


def test_a_turn_renders_with_its_tenants_salt():
    from chat.engine.events import TurnRequest
    from chat.engine.sampling import SamplingParams
    from chat.engine.turn import Turn, run_to_end

    model = tiny("tiny-llama")
    model.prompt_encoder = PromptEncoder(model._tokenizer)
    first = [{"role": "user", "content": "Hi"}]
    second = [*first, {"role": "assistant", "content": "Hello there"}, {"role": "user", "content": "How are you?"}]

    def turn(messages, salt):
        done = run_to_end(Turn(model, None, TurnRequest(messages, SamplingParams(max_tokens=1), salt=salt)))[1]
        assert done.usage.prompt_tokens == len(model.render(messages))
        return model.prompt_encoder.stats.reused

    assert turn(first, "alice") == 0
    assert turn(second, "bob") == 0  # another tenant: nothing of alice's render is reused
    assert turn(second, "alice") == 1  # her own conversation, one turn on: reused
