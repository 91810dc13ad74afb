"""Constrained decoding, penalties, logit bias and log-probabilities in the engine (fake runtime: its "model" wants
to write ``reply N ünï``, so every constrained reply below is the grammar's doing)."""

from __future__ import annotations

import json

import jsonschema
import pytest
import torch

from cache import PrefixCache
from chat.engine.constraints import Constraint, GrammarCompiler, GrammarError, GrammarSpec, canonical_json
from chat.engine.events import TurnRequest
from chat.engine.sampling import Penalties, SamplingParams, shape
from chat.engine.turn import Turn, run_to_end
from tests.chat.engine.fakes import FakeRuntime

SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 6}, "ok": {"type": "boolean"}, "n": {"enum": [1, 2]}},
    "required": ["name", "ok", "n"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def compiler():
    return GrammarCompiler(FakeRuntime().constraint_tokenizer())


def reply(params: SamplingParams, compiler=None, runtime=None, cache=None, text="hi"):
    runtime = runtime or FakeRuntime()
    grammar = compiler.compile(params.grammar) if params.grammar is not None else None
    turn = Turn(runtime, cache, TurnRequest([{"role": "user", "content": text}], params), grammar=grammar)
    return run_to_end(turn)[1]


def test_a_schema_constrained_reply_parses_and_validates(compiler):
    spec = GrammarSpec("json_schema", canonical_json(SCHEMA))
    done = reply(SamplingParams(max_tokens=200, grammar=spec), compiler)
    assert done.finish_reason == "stop"
    jsonschema.validate(json.loads(done.text), SCHEMA)
    assert not done.text.startswith("reply")  # what the fake model would have said unconstrained


@pytest.mark.parametrize("seed", range(5))
def test_sampled_constrained_replies_validate_too(compiler, seed):
    spec = GrammarSpec("json_schema", canonical_json(SCHEMA))
    done = reply(SamplingParams(temperature=1.0, seed=seed, max_tokens=200, grammar=spec), compiler)
    assert done.finish_reason == "stop"
    jsonschema.validate(json.loads(done.text), SCHEMA)


def test_json_object_regex_and_choice(compiler):
    obj_params = SamplingParams(max_tokens=100, grammar=GrammarSpec("json_object"))
    obj = reply(obj_params, compiler, runtime=FakeRuntime(script=lambda p: '{"k":"v"} and more'))
    assert obj.finish_reason == "stop" and obj.text == '{"k":"v"}'  # ends where the object does
    rx = reply(SamplingParams(max_tokens=100, grammar=GrammarSpec("regex", "[0-9]{3}-[a-z]{2}")), compiler)
    assert len(rx.text) == 6 and rx.text[3] == "-" and rx.text[:3].isdigit() and rx.finish_reason == "stop"
    choice = reply(SamplingParams(max_tokens=100, grammar=GrammarSpec("choice", '["yes","no way"]')), compiler)
    assert choice.text in ("yes", "no way")
    lark = reply(SamplingParams(max_tokens=100, grammar=GrammarSpec("grammar", 'start: "a" "b"+')), compiler)
    assert lark.text.startswith("ab") and set(lark.text[1:]) == {"b"}


def test_a_reply_cut_by_max_tokens_is_length(compiler):
    done = reply(SamplingParams(max_tokens=3, grammar=GrammarSpec("json_schema", canonical_json(SCHEMA))), compiler)
    assert done.finish_reason == "length" and len(done.token_ids) == 3


@pytest.mark.parametrize(
    "spec",
    [
        GrammarSpec("json_schema", canonical_json({"type": "nope"})),
        GrammarSpec("json_schema", canonical_json({"type": "object", "properties": {"a": {"minimum": "x"}}})),
        GrammarSpec("regex", "(("),
        GrammarSpec("grammar", "start: undefined_rule"),
        GrammarSpec("choice", "[]"),
        GrammarSpec("regex", "a" * 70_000),
    ],
)
def test_bad_grammars_are_refused_with_a_grammar_error(compiler, spec):
    with pytest.raises(GrammarError):
        compiler.compile(spec)


def test_compiled_grammars_are_cached_by_digest(compiler):
    schema = {"type": "object", "required": ["x"], "properties": {"x": {}}}
    a = GrammarSpec("json_schema", canonical_json(schema))
    b = GrammarSpec("json_schema", canonical_json(json.loads(json.dumps(schema, indent=4))))
    assert a.digest == b.digest
    hits = compiler.hits
    assert compiler.compile(a) is compiler.compile(b)
    assert compiler.hits == hits + 1
    assert GrammarSpec("json_schema", a.source, strict=False).digest != a.digest


def test_properties_come_in_the_schemas_order(compiler):
    runtime = FakeRuntime(script=lambda prompt: '{"name":"Oslo","big":true} and on')
    for order in (["name", "big"], ["big", "name"]):
        props = {"name": {"type": "string"}, "big": {"type": "boolean"}}
        schema = {"type": "object", "properties": {k: props[k] for k in order}, "required": order}
        done = reply(
            SamplingParams(max_tokens=60, grammar=GrammarSpec("json_schema", canonical_json(schema))), compiler, runtime
        )
        assert done.text.startswith('{"' + order[0] + '":')


def test_strict_refuses_what_it_cannot_enforce_and_lenient_ignores_it(compiler):
    schema = canonical_json({"type": "object", "properties": {"a": {"type": "string", "format": "no-such-format"}}})
    with pytest.raises(GrammarError):
        compiler.compile(GrammarSpec("json_schema", schema, strict=True))
    compiler.compile(GrammarSpec("json_schema", schema, strict=False))


def test_each_constraint_keeps_its_own_state(compiler):
    compiled = compiler.compile(GrammarSpec("regex", "ab"))
    first, second = Constraint(compiled), Constraint(compiled)
    first.accept(ord("a"))
    scores = torch.zeros(260)
    assert torch.isinf(second.mask(scores.clone())[ord("b")])  # the second still expects "a"
    assert not torch.isinf(first.mask(scores.clone())[ord("b")])


def test_logit_bias_moves_the_greedy_pick():
    done = reply(SamplingParams(max_tokens=4, logit_bias=((ord("Q"), 100.0),)))
    assert done.text == "QQQQ"


def test_penalties_count_the_replys_own_tokens():
    params = SamplingParams(presence_penalty=0.5, frequency_penalty=0.25, repetition_penalty=2.0)
    penalties = Penalties(params, prompt=[3])
    logits = torch.tensor([1.0, 1.0, 1.0, 4.0, -1.0])
    assert shape(logits, params, penalties).tolist() == [1.0, 1.0, 1.0, 2.0, -1.0]  # repetition: the prompt's 3
    penalties.record(1)
    penalties.record(1)
    penalties.record(4)
    scores = shape(logits, params, penalties).tolist()
    assert scores[1] == pytest.approx(1.0 / 2.0 - 0.5 - 0.5)  # repeated twice: /2, presence, 2 x frequency
    assert scores[4] == pytest.approx(-1.0 * 2.0 - 0.5 - 0.25)
    assert scores[0] == 1.0 and logits.tolist() == [1.0, 1.0, 1.0, 4.0, -1.0]  # the raw logits are untouched


def test_a_frequency_penalty_in_a_turn_counts_what_the_turn_wrote():
    runtime = FakeRuntime(script=lambda prompt: "a" * 10)  # "a" scores 100, everything else 0
    near = ((ord("b"), 99.5),)  # "b" just under "a"
    assert reply(SamplingParams(max_tokens=6, logit_bias=near), runtime=runtime).text == "aaaaaa"
    penalized = reply(SamplingParams(max_tokens=6, logit_bias=near, frequency_penalty=1.0), runtime=runtime)
    assert penalized.text == "ababab"  # each pick lowers itself by 1 for the next


def test_logprobs_are_reported_per_token_with_alternatives():
    done = reply(SamplingParams(max_tokens=5, logprobs=True, top_logprobs=3))
    assert [lp.token for lp in done.logprobs] == list(done.token_ids[: len(done.logprobs)])
    assert len(done.logprobs) == 5
    for lp in done.logprobs:
        assert len(lp.top) == 3 and lp.top[0][0] == lp.token and lp.logprob == pytest.approx(0.0, abs=1e-6)


def test_prompt_logprobs_take_nothing_from_the_cache_and_cover_every_prompt_token():
    runtime, cache = FakeRuntime(), PrefixCache()
    reply(SamplingParams(max_tokens=2), runtime=runtime, cache=cache)  # stores the prompt
    turn = Turn(
        runtime,
        cache,
        TurnRequest([{"role": "user", "content": "hi"}], SamplingParams(max_tokens=0, prompt_logprobs=True)),
    )
    _, done = run_to_end(turn)
    prompt = runtime.render([{"role": "user", "content": "hi"}])
    assert done.usage.cached_tokens == 0 and done.finish_reason == "length" and not done.token_ids
    assert done.prompt_logprobs[0] is None and [lp.token for lp in done.prompt_logprobs[1:]] == prompt[1:]


def test_max_tokens_none_runs_to_the_end_of_the_context():
    runtime = FakeRuntime(script=lambda prompt: "x" * 500, context_window=64)
    done = reply(SamplingParams(max_tokens=None), runtime=runtime)
    assert done.finish_reason == "length" and done.usage.prompt_tokens + len(done.token_ids) == 64


def test_a_mask_batch_fills_the_masks_a_constraint_would_compute_itself(compiler):
    from chat.engine.constraints import MaskBatch

    compiled = compiler.compile(GrammarSpec("json_schema", canonical_json(SCHEMA)))
    ahead, itself = Constraint(compiled), Constraint(compiled)
    for token in b'{"name":"':
        ahead.accept(token)
        itself.accept(token)
    masks = MaskBatch()
    masks.wait(masks.start([ahead, itself.__class__(compiled)]))
    assert not ahead.needs_mask and itself.needs_mask
    scores = torch.randn(260)
    assert torch.equal(ahead.mask(scores.clone()), itself.mask(scores.clone()))
    masks.close()


def test_n_replies_are_seeded_one_apart():
    from chat.server.reply.choices import with_seeds

    request = TurnRequest([], SamplingParams(temperature=1.0, seed=41))
    assert [r.params.seed for r in with_seeds(request, 3)] == [41, 42, 43]
    unseeded = TurnRequest([], SamplingParams(temperature=1.0))
    assert [r.params.seed for r in with_seeds(unseeded, 2)] == [None, None]


def test_each_turn_says_why_its_reuse_stopped_where_it_did():
    runtime, cache = FakeRuntime(), PrefixCache()

    def ask(messages, **params):
        turn = Turn(runtime, cache, TurnRequest(messages, SamplingParams(max_tokens=3, **params)))
        return run_to_end(turn)[1].usage

    first = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello there"}]
    assert ask(first).cache_miss_reason == "cold"
    assert (ask(first).cache_miss_reason, ask(first).cache_miss_at) == (None, None)  # a full hit
    fresh = Turn(runtime, cache, TurnRequest([{"role": "user", "content": "other"}], SamplingParams(max_tokens=1)))
    assert run_to_end(fresh)[1].usage.cache_miss_reason == "diverged"  # cached sequences go on otherwise at 0
    reply = run_to_end(Turn(runtime, cache, TurnRequest(first, SamplingParams(max_tokens=50))))[1].text
    longer = [*first, {"role": "assistant", "content": reply}, {"role": "user", "content": "more"}]
    usage = ask(longer)  # the history is what the model wrote: reuse ends where the cache does
    assert usage.cache_miss_reason == "end_of_cache" and usage.cache_miss_at == usage.cached_tokens
    drifted = [*first, {"role": "assistant", "content": "hi"}, {"role": "user", "content": "more"}]
    assert ask(drifted).cache_miss_reason == "diverged"  # the history says otherwise than the model wrote
    edited = [first[0], {"role": "user", "content": "hello world"}]
    usage = ask(edited)
    system = len(runtime.render(first[:1], add_generation_prompt=False))
    assert usage.cache_miss_reason == "diverged" and usage.cache_miss_at == system + 1 + len("hello ")
    assert ask(edited, prompt_logprobs=True).cache_miss_reason == "prompt_logprobs"
    empty_cache = Turn(FakeRuntime(), PrefixCache(), TurnRequest(first, SamplingParams(max_tokens=1)))
    assert run_to_end(empty_cache)[1].usage.cache_miss_reason == "cold"
    no_cache = Turn(FakeRuntime(), None, TurnRequest(first, SamplingParams(max_tokens=1)))
    assert run_to_end(no_cache)[1].usage.cache_miss_reason == "cache_off"


@pytest.mark.parametrize("vocab,words", [(70, 3), (64, 2), (96, 2), (5, 1)])
def test_a_bitmask_forbids_exactly_the_tokens_whose_bit_is_zero(vocab, words):
    from chat.engine.constraints import apply_bitmask

    generator = torch.Generator().manual_seed(vocab)
    bitmask = torch.randint(-(2**31), 2**31 - 1, (2, words), dtype=torch.int32, generator=generator)
    scores = torch.randn(2, vocab, generator=generator)
    masked = scores.clone()
    apply_bitmask(masked, bitmask)
    for row in range(2):
        for token in range(vocab):  # token t is bit t % 32 of word t // 32; past the words' bits: forbidden
            word = token // 32
            allowed = word < words and (int(bitmask[row, word]) >> (token % 32)) & 1 == 1
            expected = scores[row, token].item() if allowed else float("-inf")
            assert masked[row, token].item() == expected, (row, token)
