"""chat.models.decoder.model: turncache's own forward against transformers' forward (the oracle), for every tiny model
of the families it computes: float32 logits within 1e-4 over prefill, decode, cache hits, rewinds and sliding windows,
in batches and alone; int8 logits bit for bit the same from the cache or without it, in a batch or alone. Each
float32 test takes a device parameter: the CPU with the native kernels, the CPU on torch's operations (the code a
GPU runs), and CUDA where torch sees a device (skipped, with the reason, where it does not)."""

from __future__ import annotations

import functools
import random

import pytest
import torch
from torch import nn

from cache import Namespace, PrefixCache
from chat.engine.runtime import Feed, StepInterrupted
from chat.models import load_model
from chat.models.decoder.model import FAMILIES, NotPackable, canonical_weights, decoder_args
from chat.models.decoder.names import CHECKPOINT_NAMES
from chat.models.kernels import native
from chat.models.tiny.text import WINDOW
from chat.tools.testing.baselines import load_stock

torch.set_num_threads(1)

TOLERANCE = 1e-4
PACKABLE = ["tiny-llama", "tiny-qwen2", "tiny-qwen3", "tiny-mistral", "tiny-gemma2", "tiny-gemma3"]


@pytest.fixture(
    params=[
        "cpu",  # the native kernels where this machine has them
        "cpu-torch",  # torch's operations on the CPU: the code a GPU runs
        pytest.param(
            "cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="torch sees no CUDA device here")
        ),
    ]
)
def device(request):
    """Where the forward runs, and on which kernels (``cpu-torch``: the native kernels turned off)."""
    if request.param == "cpu-torch":
        with native.disabled():
            yield "cpu"
    else:
        yield request.param


@functools.cache
def ours(spec: str, device: str = "cpu", weights: str = "float32"):
    return load_model(spec, weights=weights, device=device)


@functools.cache
def oracle(spec: str, device: str = "cpu"):
    return load_stock(spec).model.to(device)


def reference(spec: str, device: str, tokens: list[int]) -> torch.Tensor:
    """transformers' logits for ``tokens`` from empty, in one forward: ``[n, vocab]`` float32 on the CPU."""
    with torch.inference_mode():
        ids = torch.tensor([tokens], device=device)
        return oracle(spec, device)(input_ids=ids).logits[0].float().cpu()


def tokens_of(model, n: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(3, model.vocab_size) for _ in range(n)]


def diff(a: torch.Tensor, b: torch.Tensor) -> float:
    assert a.shape == b.shape, (a.shape, b.shape)
    return (a.float().cpu() - b.float().cpu()).abs().max().item()


@pytest.mark.parametrize("spec", PACKABLE)
def test_prefill_and_decode_alone_give_transformers_logits(spec, device):
    model = ours(spec, device)
    assert type(model).__name__ == "DecoderAdapter"
    tokens = tokens_of(model, 3 * WINDOW + 5, seed=1)  # past the window: sliding layers roll over
    run = model.new_run()
    got = [model.forward(run, tokens[:7])]
    got += [model.forward(run, [t]) for t in tokens[7:20]]  # decode steps
    got.append(model.forward(run, tokens[20:]))  # a chunk after them
    assert diff(torch.cat(got), reference(spec, device, tokens)) <= TOLERANCE
    model.close_run(run)


@pytest.mark.parametrize("spec", PACKABLE)
def test_runs_in_one_batch_give_transformers_logits(spec, device):
    """Three runs of different lengths share every forward: prefill chunks beside decode steps, a run restored from
    the cache (adopting its rows by reference), and a rewind of drafts."""
    model = ours(spec, device)
    seqs = [tokens_of(model, n, seed=10 + i) for i, n in enumerate((40, 29, 35))]
    cache, ns = PrefixCache(), Namespace(model.fingerprint, model.dtype)
    seed = model.new_run()
    model.forward(seed, seqs[2][:13])
    cache.insert(ns, seqs[2][:13], model.export(seed))
    model.close_run(seed)
    lease = cache.acquire(cache.lookup(ns, seqs[2]), ns)
    runs = [model.new_run(), model.new_run(), model.new_run(lease)]
    assert runs[2].length == 13
    logits: list[list[torch.Tensor]] = [[], [], []]
    schedule = [(11, 1, 5), (1, 9, 4), (1, 1, 1), (6, 1, 1), (1, 12, 9), (1, 1, 1)]
    for sizes in schedule:
        feeds, owners = [], []
        for i, n in enumerate(sizes):
            at = runs[i].length
            if at < len(seqs[i]):
                feeds.append(Feed(runs[i], seqs[i][at : at + n], len(seqs[i][at : at + n])))
                owners.append(i)
        for i, out in zip(owners, model.forward_batch(feeds), strict=True):
            assert isinstance(out, torch.Tensor), out
            logits[i].append(out)
    drafts = tokens_of(model, 3, seed=99)  # drafts fed and rejected: the run goes on as if never fed
    model.forward(runs[0], drafts)
    model.rewind(runs[0], 3)
    for i, run in enumerate(runs):
        if run.length < len(seqs[i]):
            logits[i].append(model.forward(run, seqs[i][run.length :]))
        start = 13 if i == 2 else 0
        assert diff(torch.cat(logits[i]), reference(spec, device, seqs[i])[start:]) <= TOLERANCE, i
    cache.release(lease)


@pytest.mark.parametrize("spec", ["tiny-llama", "tiny-gemma3"])
def test_an_interrupted_forward_leaves_every_run_as_it_was(spec, device):
    """A forward stopped between layers (its ``interrupt`` said so) raises StepInterrupted and leaves each run as
    before: the same feeds then give the logits of twin runs that were never interrupted, bit for bit, in a batch
    and alone (runs past the sliding window, so rotating rows are put back too)."""
    model = ours(spec, device)
    seqs = [tokens_of(model, n, seed=30 + i) for i, n in enumerate((WINDOW + 9, 2 * WINDOW + 3))]
    runs, twins = [model.new_run() for _ in seqs], [model.new_run() for _ in seqs]
    for run, twin, seq in zip(runs, twins, seqs, strict=True):
        model.forward(run, seq[:-4])
        model.forward(twin, seq[:-4])
    layers = model._model.args.layers
    for stop_at in (1, layers - 1):  # before the second layer, before the last
        asked = []

        def interrupt(asked=asked, stop_at=stop_at) -> bool:
            asked.append(1)
            return len(asked) == stop_at

        lengths = [r.length for r in runs]
        with pytest.raises(StepInterrupted):
            model.forward_batch([Feed(r, seq[-4:-1], 3) for r, seq in zip(runs, seqs, strict=True)], interrupt)
        assert len(asked) == stop_at and [r.length for r in runs] == lengths and not any(r.broken for r in runs)
        with pytest.raises(StepInterrupted):  # one feed alone: the same
            model.forward_batch([Feed(runs[1], seqs[1][-4:], 4)], lambda: True)
        assert runs[1].length == lengths[1] and not runs[1].broken
    got = model.forward_batch([Feed(r, seq[-4:-1], 3) for r, seq in zip(runs, seqs, strict=True)], lambda: False)
    want = model.forward_batch([Feed(r, seq[-4:-1], 3) for r, seq in zip(twins, seqs, strict=True)])
    assert all(torch.equal(g, w) for g, w in zip(got, want, strict=True))
    got, want = model.forward(runs[0], seqs[0][-1:]), model.forward(twins[0], seqs[0][-1:])
    assert torch.equal(got, want)
    assert diff(want, reference(spec, device, seqs[0])[-1:]) <= TOLERANCE
    for run in runs + twins:
        model.close_run(run)


@pytest.mark.parametrize("spec", ["tiny-mistral", "tiny-qwen3", "tiny-gemma2", "tiny-gemma3"])
def test_a_sliding_run_restored_after_its_window_rolled_over(spec, device):
    model = ours(spec, device)
    tokens = tokens_of(model, 150, seed=3)
    cache, ns = PrefixCache(), Namespace(model.fingerprint, model.dtype)
    run = model.new_run()
    model.forward(run, tokens[:120])
    cache.insert(ns, tokens[:120], model.export(run))
    model.close_run(run)
    query = [*tokens[:100], *tokens_of(model, 20, seed=4)]  # diverges 20 tokens back: within the margin
    match = cache.lookup(ns, query)
    assert match is not None and match.length == 100
    lease = cache.acquire(match, ns)
    run = model.new_run(lease)
    got = torch.cat([model.forward(run, query[100:105]), *(model.forward(run, [t]) for t in query[105:])])
    assert diff(got, reference(spec, device, query)[100:]) <= TOLERANCE
    cache.release(lease)


@pytest.mark.parametrize("spec", PACKABLE)
def test_the_comparison_has_power(spec):
    """A run restored from another prefix is far off transformers' logits: the tolerance does not hide wrong rows."""
    model = ours(spec)
    tokens, other = tokens_of(model, 30, seed=5), tokens_of(model, 30, seed=6)
    cache, ns = PrefixCache(), Namespace(model.fingerprint, model.dtype)
    run = model.new_run()
    model.forward(run, other[:20])
    cache.insert(ns, tokens[:20], model.export(run))  # the wrong rows under the right tokens
    lease = cache.acquire(cache.lookup(ns, tokens), ns)
    wrong = model.forward(model.new_run(lease), tokens[20:])
    assert diff(wrong, reference(spec, "cpu", tokens)[20:]) > 100 * TOLERANCE
    cache.release(lease)


needs_kernels = pytest.mark.skipif(native.kernels() is None, reason="no native kernels on this machine")


@needs_kernels
@pytest.mark.parametrize("spec", PACKABLE)
def test_int8_turns_are_bit_for_bit_from_the_cache_and_in_a_batch(spec):
    """int8 weights with the native kernels: a prompt's logits are the same bits computed whole, from a cached
    prefix in chunks and decode steps, or inside a batch beside other runs."""
    model = ours(spec, weights="int8")
    assert model.weights == "int8" and model.dtype == "float16"
    tokens = tokens_of(model, 60, seed=7)
    run = model.new_run()
    whole = model.forward(run, tokens)
    model.close_run(run)
    cache, ns = PrefixCache(), Namespace(model.fingerprint, model.dtype)
    run = model.new_run()
    model.forward(run, tokens[:23])
    cache.insert(ns, tokens[:23], model.export(run))
    model.close_run(run)
    lease = cache.acquire(cache.lookup(ns, tokens), ns)
    restored = model.new_run(lease)
    cached = torch.cat([model.forward(restored, tokens[23:30]), *(model.forward(restored, [t]) for t in tokens[30:])])
    assert torch.equal(cached, whole[23:])
    others = [model.new_run() for _ in range(2)]
    batched, alone = model.new_run(), []
    at = 0
    for size in (9, 1, 1, 17, 1, 31):
        feeds = [Feed(batched, tokens[at : at + size], size)]
        feeds += [Feed(r, tokens_of(model, 1 + (size + j) % 4, seed=at + j), 1) for j, r in enumerate(others)]
        alone.append(model.forward_batch(feeds)[0])
        at += size
    assert torch.equal(torch.cat(alone), whole)
    cache.release(lease)


@pytest.mark.parametrize("spec", PACKABLE)
def test_layer_windows_are_the_cache_layout_transformers_gives(spec):
    """Each layer's window is what transformers' cache layout says (entries stored by either forward restore)."""
    from transformers.cache_utils import get_layer_types_and_kwargs

    config = oracle(spec).config
    kinds, kwargs = get_layer_types_and_kwargs(config)
    assert decoder_args(config).windows == tuple(k.get("sliding_window") for k in kwargs)
    assert any(w is not None for w in decoder_args(config).windows) == ("sliding_attention" in kinds)


def test_the_loader_picks_the_forward_by_family():
    assert type(ours("tiny-gemma2")).__name__ == "DecoderAdapter"
    assert type(load_model("tiny-lfm2")).__name__ == "TransformersAdapter"  # hybrid recurrent: transformers'
    assert set(FAMILIES) == {"llama", "mistral", "qwen2", "qwen3", "gemma2", "gemma3_text"}


def test_settings_the_decoder_does_not_compute_are_refused_by_name():
    config = oracle("tiny-llama").config
    for change, why in [
        ({"rope_parameters": {"rope_type": "yarn", "rope_theta": 1e4, "factor": 4.0}}, "yarn"),
        ({"hidden_act": "relu2"}, "relu2"),
        ({"model_type": "phi3"}, "phi3"),
    ]:
        changed = config.__class__.from_dict({**config.to_dict(), **change})
        if "model_type" in change:
            changed.model_type = change["model_type"]
        with pytest.raises(NotPackable, match=why):
            decoder_args(changed)


def test_weights_are_mapped_in_one_place_and_fused_in_order():
    model = oracle("tiny-qwen2")
    args = decoder_args(model.config)
    state = model.state_dict()
    named = canonical_weights(state, args)
    attn = "model.layers.1.self_attn."
    assert torch.equal(
        named["layers.1.qkv.weight"],
        torch.cat([state[attn + "q_proj.weight"], state[attn + "k_proj.weight"], state[attn + "v_proj.weight"]]),
    )
    assert torch.equal(named["layers.1.qkv.bias"][: args.qkv_sizes[0]], state[attn + "q_proj.bias"])
    mlp = "model.layers.1.mlp."
    assert torch.equal(
        named["layers.1.gate_up.weight"], torch.cat([state[mlp + "gate_proj.weight"], state[mlp + "up_proj.weight"]])
    )
    assert all("{i}" in k or "layers" not in k for k in CHECKPOINT_NAMES)
    with pytest.raises(NotPackable, match="unexpected weight"):
        canonical_weights({**state, "model.layers.0.mlp.experts.0.weight": state[mlp + "up_proj.weight"]}, args)


def test_off_the_cpu_int8_and_transformers_models_are_refused():
    from chat.models import InvalidSettingError

    with pytest.raises(InvalidSettingError) as info:
        load_model("tiny-llama", weights="int8", device="cuda" if torch.cuda.is_available() else "meta")
    assert info.value.field == "device"
    with pytest.raises(InvalidSettingError) as info:
        load_model("tiny-llama", device="not-a-device")
    assert info.value.field == "device"


def test_a_packable_model_leaves_transformers_as_it_is():
    """Serving a model of the own decoder's families imports none of the machinery that bends transformers' forward
    (the packed attention and its module-level stack, the cache-layer subclasses, the module surgery, the adapters:
    chat.models.hf's GGUF reader and media family tables, which the loader imports at its top, are none of it),
    registers nothing with transformers, and writes no private attribute of its config."""
    import json
    import subprocess
    import sys
    import textwrap
    from pathlib import Path

    script = textwrap.dedent(
        """
        import json, sys, torch
        torch.set_num_threads(1)
        from transformers import AttentionInterface
        from chat.engine.runtime import Feed, StepInterrupted
        from chat.models import load_model
        before = sorted(AttentionInterface._global_mapping)
        model = load_model("tiny-gemma2", weights="int8")
        run = model.new_run()
        model.forward_batch([Feed(run, [5, 6, 7], 1)])
        print(json.dumps({
            "modules": sorted(m for m in sys.modules if m.startswith("chat.models.")),
            "registered": sorted(AttentionInterface._global_mapping) != before,
            "attention": model._model.config._attn_implementation_internal,
        }))
        """
    )
    root = Path(__file__).resolve().parents[4]
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300, cwd=root)
    assert done.returncode == 0, done.stderr[-2000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert "chat.models.decoder.model" in seen["modules"]
    bending = ("runtime", "multimodal", "ragged", "run_cache", "fast_paths")  # transformers' forward, its patches
    assert all((root / "chat" / "models" / "hf" / f"{name}.py").is_file() for name in bending)
    assert [m for m in seen["modules"] if m.removeprefix("chat.models.hf.") in bending] == []
    assert not seen["registered"]
    assert seen["attention"] in (None, "sdpa", "eager")  # as transformers set it when the config was made


def test_a_format_built_from_the_checkpoints_modules_slots_in(monkeypatch):
    """A weight format whose data the checkpoint's modules hold (a GGUF file's blocks) is an object with
    ``from_layers``: it gets each matrix's modules in output order (q, k, v; gate, up), and the forward computes
    through whatever it returns."""
    from chat.models.decoder.model import build_decoder, linear_modules
    from chat.models.decoder.runtime import DecoderAdapter
    from chat.models.kernels import dense_matrices, matrices

    class FromModules:  # stands for a block format: here the modules' own float weights
        def __init__(self) -> None:
            self.calls: list[list[nn.Module]] = []

        def from_layers(self, modules):
            self.calls.append(modules)
            bias = None if modules[0].bias is None else torch.cat([m.bias.detach() for m in modules])
            return dense_matrices.Float32Matrix(torch.cat([m.weight.detach() for m in modules]), bias)

    fmt = FromModules()
    monkeypatch.setitem(matrices.MATRICES, "from-modules", fmt)
    stock = load_stock("tiny-qwen2")
    args = decoder_args(stock.model.config)
    decoder = build_decoder(
        stock.model.config, stock.model.state_dict(), "from-modules", layers=linear_modules(stock.model, args)
    )
    attn = stock.model.model.layers[0].self_attn
    assert fmt.calls[0] == [attn.q_proj, attn.k_proj, attn.v_proj] and len(fmt.calls) == 4 * args.layers + 1
    model = DecoderAdapter(
        decoder,
        stock.tokenizer,
        name="tiny-qwen2",
        fingerprint="from-modules",
        kv_dtype="float32",
        context_window=4096,
        eos_token_ids=set(),
        weights="from-modules",
    )
    tokens = tokens_of(model, 20, seed=8)
    assert diff(model.forward(model.new_run(), tokens), reference("tiny-qwen2", "cpu", tokens)) <= TOLERANCE


def test_the_forward_is_part_of_the_cache_namespace():
    """States computed by the own forward never meet states of transformers' forward for the same weights (a disk
    cache written before the own forward existed, say): their last bits differ, and int8 turns from the cache must be
    bit for bit the turns computed without it."""
    from chat.models.fingerprint import model_fingerprint, tensors_digest

    model, stock = ours("tiny-llama"), load_stock("tiny-llama")
    digest = tensors_digest(stock.model.state_dict().items())
    before = model_fingerprint("tiny-llama", stock.model.config, stock.tokenizer, digest, "float32")
    assert model.fingerprint != before
    assert model.fingerprint.startswith("tiny-llama@")
