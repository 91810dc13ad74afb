"""The built-in default model, read straight from its GGUF file: answers a factual question greedily in float32 and
in the file's own blocks, restores a cached prefix exactly, and loads in its default weight format."""

from __future__ import annotations

import pytest

from cache import PrefixCache
from chat.models import load_model
from tests.chat.models.helpers import TOLERANCE, full_logits, namespace, restored_logits, store

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def smollm2():
    return load_model("smollm2", weights="float32")  # the file's weights dequantized


def greedy(model, messages, max_tokens=16):
    run = model.new_run()
    logits = model.forward(run, model.render(messages), last_only=True)
    detok, text = model.detokenizer(), []
    for _ in range(max_tokens):
        token = int(logits[-1].argmax())
        if token in model.eos_token_ids:
            break
        text.append(detok.push(token))
        logits = model.forward(run, [token])
    model.close_run(run)
    return "".join(text) + detok.flush()


def test_the_default_model_knows_the_capital_of_france(smollm2):
    assert smollm2.name == "smollm2" and smollm2.dtype == "float32"
    assert smollm2.context_window == 8192 and smollm2.vocab_size == 49152
    assert smollm2.eos_token_ids == {2} and not smollm2.has_recurrent_state
    reply = greedy(smollm2, [{"role": "user", "content": "What is the capital of France?"}])
    assert "Paris" in reply


def test_the_files_own_blocks_answer_as_float32_does(smollm2):
    blocks = load_model("smollm2", weights="gguf")
    question = [{"role": "user", "content": "What is the capital of France?"}]
    assert greedy(blocks, question) == greedy(smollm2, question)


def test_the_default_model_restores_a_prefix_exactly(smollm2):
    tokens = smollm2.render([{"role": "user", "content": "Name three colours of the rainbow, please."}])
    cache = PrefixCache()
    store(smollm2, cache, tokens[:-4])
    hit, rest = restored_logits(smollm2, cache, tokens, pieces=(1, 1))
    assert hit == len(tokens) - 4
    assert (rest - full_logits(smollm2, tokens)[hit:]).abs().max().item() <= 5 * TOLERANCE  # 30 layers, logits ~20
    assert namespace(smollm2).model.startswith("smollm2@")


def test_the_default_load_uses_the_default_weight_format_in_its_own_namespace(smollm2):
    from chat.models.specs import GGUF_DEFAULT_WEIGHTS

    default = load_model("smollm2")
    assert default.weights == GGUF_DEFAULT_WEIGHTS == "gguf-q16"  # the rule's choice (float32's answers)
    assert default.fingerprint.startswith(f"smollm2+{default.weights}@") and smollm2.fingerprint.startswith("smollm2@")
    reply = greedy(default, [{"role": "user", "content": "Name three primary colors."}])
    assert "red" in reply.lower() and "blue" in reply.lower()
    question = [{"role": "user", "content": "What is the capital of France?"}]
    assert greedy(default, question) == greedy(smollm2, question)  # float32's answer (int8's was broken French)
