"""Any GGUF file loads (``load_model("/path/x.gguf")``) straight from its bytes: tiny GGUF files written here from the
seeded tiny-llama give that model's logits (F32) or its dequantized weights' logits (Q8_0 ...), render with the
template from their metadata, serve a turn through the engine whose second turn hits the cache, write nothing to disk
but the record of their digest, get one cache namespace per distinct file, and every file that cannot be served is
refused with a typed error naming it, before any weights are read. (The block formats: test_gguf_blocks.py.)"""

from __future__ import annotations

import asyncio
import os
import shutil

import numpy as np
import pytest
import torch

from cache import PrefixCache
from chat.engine.engine import Engine
from chat.engine.errors import NoChatTemplateError
from chat.engine.events import Done, TurnRequest
from chat.engine.sampling import SamplingParams
from chat.models import ModelFileError, UnsupportedArchitectureError, gguf_files, load_model, load_renderer
from chat.models.decoder import gguf_weights
from chat.models.hf import gguf_model, metadata_store
from tests.chat.models.gguf_helpers import (
    dequantized_copy,
    reference_lfm2,
    reference_llama,
    reference_qwen3,
    write_tiny_gguf,
)
from tests.chat.models.helpers import TOLERANCE, default_blas_forms, full_logits, random_tokens, tiny

QUANTIZED = ["Q8_0", "Q4_0", "Q4_1", "Q5_1", "F16"]  # written by gguf-py; llama.cpp's common file types
MESSAGES = [{"role": "user", "content": "What is the capital of France? Tell me about bees and honey."}]


@pytest.fixture(scope="module", autouse=True)
def home(tmp_path_factory):
    """Digests of this module go to a fresh $TURNCACHE_HOME."""
    home = tmp_path_factory.mktemp("turncache-home")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TURNCACHE_HOME", str(home))
        yield home / "models"


@pytest.fixture(scope="module", autouse=True)
def same_forms():
    """Every float32 load of this module keeps the default BLAS forms: its tests compare separate loads bit for bit
    on a few tokens, where the timed forms round differently (tests.chat.models.helpers.default_blas_forms)."""
    with default_blas_forms():
        yield


@pytest.fixture(scope="session")
def reference():
    torch.set_num_threads(1)
    return reference_llama()


@pytest.fixture(scope="session")
def files(tmp_path_factory, reference):
    """name -> a tiny GGUF file, written once per test session."""
    folder = tmp_path_factory.mktemp("gguf")
    files = {"f32": write_tiny_gguf(folder / "tiny-llama-f32.gguf", reference)}
    for qtype in QUANTIZED:
        files[qtype.lower()] = write_tiny_gguf(folder / f"tiny-llama-{qtype.lower()}.gguf", reference, qtype=qtype)
    return files


@pytest.fixture(scope="module")
def f32_model(files):
    return load_model(str(files["f32"]), weights="float32")


@pytest.fixture(scope="module")
def q8_model(files):
    return load_model(str(files["q8_0"]), weights="float32")


def hf_logits(model: torch.nn.Module, tokens: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return model(torch.tensor([tokens])).logits[0].float()


def no_weights_read(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("tensors were read")

    monkeypatch.setattr(gguf_model, "_fill", refuse)
    monkeypatch.setattr(gguf_model, "_dequantized_by_transformers", refuse)
    monkeypatch.setattr(gguf_weights, "read_weights", refuse)


def written(home) -> list[str]:
    """Files under $TURNCACHE_HOME/models, but the records of file digests and the kept metadata."""
    kept = (gguf_files.IDENTITY_DIR, metadata_store.STORE_DIR)
    return sorted(str(p.relative_to(home)) for p in home.rglob("*") if p.is_file() and not set(kept) & set(p.parts))


# ==================================================================== files that load


def test_an_f32_gguf_gives_the_float32_models_logits_and_template(f32_model, reference):
    llama = tiny("tiny-llama")
    assert f32_model.name == "tiny-llama-f32" and f32_model.weights == "float32"
    assert f32_model.vocab_size == llama.vocab_size and f32_model.eos_token_ids == llama.eos_token_ids
    tokens = f32_model.render(MESSAGES)
    assert tokens == llama.render(MESSAGES)  # tokenizer and chat template came from the GGUF's metadata
    logits = full_logits(f32_model, tokens)
    assert (logits - hf_logits(reference, tokens)).abs().max().item() <= TOLERANCE
    assert (logits - full_logits(llama, tokens)).abs().max().item() <= TOLERANCE


def test_the_stock_baseline_of_a_gguf_file_is_its_dequantized_transformers_model(files, reference):
    """Benchmarks' baselines (``bench batch``, ``bench turns`` on the built-in model) load the file's own float32
    dequantization as a stock transformers model, not a directory the file was once converted into."""
    from chat.tools.testing.baselines import load_stock

    stock = load_stock(str(files["q4_1"]))
    assert type(stock.model).__name__ == "LlamaForCausalLM"
    assert not any(hasattr(m, "block_weight") for m in stock.model.modules())  # every weight dequantized
    tokens = stock.render(MESSAGES)
    assert tokens == load_model(str(files["q4_1"]), weights="float32").render(MESSAGES)
    assert (hf_logits(stock.model, tokens) - hf_logits(dequantized_copy(reference, "Q4_1"), tokens)).abs().max() <= (
        TOLERANCE
    )


@pytest.mark.parametrize("qtype", QUANTIZED)
def test_a_quantized_gguf_gives_its_dequantized_weights_logits(files, q8_model, f32_model, reference, qtype):
    model = q8_model if qtype == "Q8_0" else load_model(str(files[qtype.lower()]), weights="float32")
    tokens = random_tokens(model, 40, seed=3)
    logits = full_logits(model, tokens)
    assert (logits - hf_logits(dequantized_copy(reference, qtype), tokens)).abs().max().item() <= TOLERANCE
    assert (logits - full_logits(f32_model, tokens)).abs().max().item() > TOLERANCE  # qtype did round the weights


@pytest.mark.parametrize("qtype", ["F32", "Q8_0"])
def test_a_qwen3_gguf_gives_its_models_logits(tmp_path, qtype):
    reference = reference_qwen3()
    path = write_tiny_gguf(tmp_path / f"tiny-qwen3-{qtype.lower()}.gguf", reference, qtype=qtype)
    model = load_model(str(path), weights="float32")
    assert model.vocab_size == reference.config.vocab_size and not model.has_recurrent_state
    tokens = model.render(MESSAGES)
    assert tokens == tiny("tiny-llama").render(MESSAGES)  # the same tokenizer and template, from the metadata
    expected = hf_logits(reference if qtype == "F32" else dequantized_copy(reference, qtype), tokens)
    assert (full_logits(model, tokens) - expected).abs().max().item() <= TOLERANCE


@pytest.mark.parametrize("qtype", ["F32", "Q8_0"])
def test_an_lfm2_gguf_read_by_transformers_newer_loader_gives_its_models_logits(tmp_path, qtype):
    reference = reference_lfm2()
    model = load_model(str(write_tiny_gguf(tmp_path / f"tiny-lfm2-{qtype.lower()}.gguf", reference, qtype=qtype)))
    assert model.has_recurrent_state and model.render(MESSAGES) == tiny("tiny-lfm2").render(MESSAGES)
    tokens = random_tokens(model, 30, seed=7)
    expected = hf_logits(reference if qtype == "F32" else dequantized_copy(reference, qtype), tokens)
    assert (full_logits(model, tokens) - expected).abs().max().item() <= TOLERANCE


def test_the_renderer_alone_renders_as_the_model_does(files, f32_model):
    renderer = load_renderer(str(files["f32"]))
    assert renderer.name == f32_model.name and renderer.render(MESSAGES) == f32_model.render(MESSAGES)


def test_different_files_have_different_namespaces_and_nothing_is_written_but_digests(files, f32_model, q8_model, home):
    assert f32_model.fingerprint.split("@")[1] != q8_model.fingerprint.split("@")[1]
    assert tiny("tiny-llama").fingerprint.split("@")[1] != f32_model.fingerprint.split("@")[1]  # weights' origin
    assert written(home) == []  # no converted copy: the weights come from the file itself
    records = list((home / gguf_files.GGUF_DIR / gguf_files.IDENTITY_DIR).iterdir())
    assert len(records) >= 2 and all(r.stat().st_size < 1000 for r in records)
    for path in (files["f32"], files["q8_0"]):  # each file's config and tokenizer, kept by its digest
        assert metadata_store.entry_path(gguf_files.identify(path).sha256).is_file()


def test_a_turn_through_the_engine_and_a_second_turn_from_the_cache(f32_model):
    engine = Engine(f32_model, cache=PrefixCache())

    async def turn(messages):
        async for event in engine.generate(TurnRequest(messages, SamplingParams(max_tokens=6, temperature=0))):
            if isinstance(event, Done):
                return event
        raise AssertionError("no Done")

    try:
        first = asyncio.run(turn(MESSAGES))
        assert first.finish_reason in ("stop", "length") and first.usage.completion_tokens >= 1
        history = [*MESSAGES, {"role": "assistant", "content": first.text}, {"role": "user", "content": "And why?"}]
        second = asyncio.run(turn(history))
    finally:
        engine.close()
    assert first.usage.cached_tokens == 0
    assert second.usage.cached_tokens >= first.usage.prompt_tokens
    assert second.usage.prompt_tokens > second.usage.cached_tokens


@pytest.mark.parametrize("name", ["f32", "q8_0", "q4_1"])
def test_the_header_reader_agrees_with_gguf_py(files, name):
    from gguf import GGUFReader

    header, reference = gguf_files.read_header(files[name]), GGUFReader(files[name])
    assert header.architecture == "llama" and header.metadata["llama.block_count"] == 4
    assert header.metadata["tokenizer.ggml.tokens"] == 384  # string arrays: their length
    assert [(t.name, t.ggml_type, t.nbytes) for t in header.tensors] == [
        (t.name, int(t.tensor_type), int(t.n_bytes)) for t in reference.tensors
    ]
    assert [header.data_start + t.offset for t in header.tensors] == [int(t.data_offset) for t in reference.tensors]
    assert [t.shape for t in header.tensors] == [tuple(int(d) for d in t.shape) for t in reference.tensors]


# ==================================================================== one namespace per distinct file


def test_a_second_load_does_not_hash_again(files, f32_model, monkeypatch):
    def no_hashing(*args, **kwargs):
        raise AssertionError("the file was hashed again")

    monkeypatch.setattr(gguf_files.hashlib, "file_digest", no_hashing)
    again = load_model(str(files["f32"]), weights="float32")
    assert again.fingerprint == f32_model.fingerprint


def test_a_second_load_of_the_same_bytes_reuses_the_parsed_metadata(files, monkeypatch):
    first = load_model(str(files["q4_0"]), weights="float32")

    def no_parsing(*args, **kwargs):
        raise AssertionError("the metadata was parsed again")

    monkeypatch.setattr(gguf_model, "load_tokenizer", no_parsing)
    monkeypatch.setattr(gguf_files, "_check_family", no_parsing)
    again = load_model(str(files["q4_0"]), weights="float32")
    assert again.fingerprint == first.fingerprint and again.render(MESSAGES) == first.render(MESSAGES)
    assert again._tokenizer is not first._tokenizer and again._model.config is not first._model.config  # copies


def test_a_load_parses_the_metadata_once(files, monkeypatch, tmp_path):
    """transformers reads the whole metadata for the config and again for the tokenizer's class: one read serves
    both (gguf_model.one_metadata_parse)."""
    from transformers import modeling_gguf_pytorch_utils as reader

    original, reads = reader.load_gguf_checkpoint, []

    def counted(path, return_tensors=False, **kwargs):
        reads.append(return_tensors)
        return original(path, return_tensors, **kwargs)

    monkeypatch.setattr(reader, "load_gguf_checkpoint", counted)
    monkeypatch.setenv("TURNCACHE_HOME", str(tmp_path))  # nothing kept from an earlier parse
    metadata_store.forget_in_memory()
    model = load_model(str(files["q8_0"]), weights="float32")
    assert reads == [False] and model.render(MESSAGES)  # one metadata read; the tokenizer works
    assert reader.load_gguf_checkpoint is counted  # restored after the load


def test_a_copy_with_the_same_bytes_shares_the_namespace(files, f32_model, tmp_path):
    copy = shutil.copyfile(files["f32"], tmp_path / "tiny-llama-f32.gguf")
    assert load_model(str(copy), weights="float32").fingerprint == f32_model.fingerprint


def test_a_changed_file_gets_a_new_namespace(files, f32_model, q8_model, tmp_path):
    path = shutil.copyfile(files["f32"], tmp_path / "tiny-llama-f32.gguf")
    before = gguf_files.identify(path)
    shutil.copyfile(files["q8_0"], path)  # new bytes at the same path
    os.utime(path, ns=(before.mtime_ns + 10**9, before.mtime_ns + 10**9))
    after = gguf_files.identify(path)
    assert after.sha256 != before.sha256 and after.sha256 == gguf_files.identify(files["q8_0"]).sha256
    changed = load_model(str(path), weights="float32")
    digest = changed.fingerprint.split("@")[1]  # after the name, which is the file's
    assert digest == q8_model.fingerprint.split("@")[1] != f32_model.fingerprint.split("@")[1]
    tokens = random_tokens(changed, 12, seed=5)
    assert torch.equal(full_logits(changed, tokens), full_logits(q8_model, tokens))


def test_a_file_without_a_chat_template_is_a_base_model(reference, f32_model, tmp_path):
    """No tokenizer.chat_template in the metadata: it loads, computes as the same weights with a template do, and
    refuses chat turns (never a guessed template); --chat-template gives it one, and another namespace."""
    path = write_tiny_gguf(tmp_path / "base.gguf", reference, chat_template=None)
    base = load_model(str(path), weights="float32")
    assert base.chats is False and f32_model.chats is True
    tokens = base.encode("What is the capital of France?")
    assert torch.equal(full_logits(base, tokens), full_logits(f32_model, tokens))
    with pytest.raises(NoChatTemplateError, match="--chat-template"):
        base.render(MESSAGES)
    assert load_renderer(str(path)).chats is False
    given = load_model(str(path), weights="float32", chat_template=f32_model._tokenizer.chat_template)
    assert given.render(MESSAGES) == f32_model.render(MESSAGES)
    assert given.fingerprint != base.fingerprint  # the same bytes, another template: another namespace


def test_a_tensor_transformers_skips_is_named_at_every_load(reference, tmp_path, caplog):
    rope_freqs = {"rope_freqs.weight": np.ones(8, dtype=np.float32)}  # how llama.cpp stores Llama 3.1's rope scaling
    path = write_tiny_gguf(tmp_path / "llama31.gguf", reference, extra_tensors=rope_freqs)
    for _ in range(2):  # said at every load
        caplog.clear()
        with caplog.at_level("WARNING", logger="chat.models.registry"):
            load_model(str(path))
        assert any("rope_freqs.weight" in r.getMessage() and str(path) in r.getMessage() for r in caplog.records)


# ==================================================================== files that are refused


def refused(spec, error, monkeypatch, home, *fragments, read: bool = False):
    """Load ``spec``; expect ``error`` naming the file and each fragment, no tensor read (unless ``read``: a fault
    found in the tensors themselves) and nothing written."""
    if not read:
        no_weights_read(monkeypatch)
    before = written(home)
    with pytest.raises(error) as info:
        load_model(str(spec))
    message = str(info.value)
    assert str(spec) in message, message
    for fragment in fragments:
        assert fragment in message, message
    assert written(home) == before
    return info.value


def test_a_missing_file(tmp_path, monkeypatch, home):
    error = refused(tmp_path / "nowhere.gguf", ModelFileError, monkeypatch, home, "no such file")
    assert error.path == str(tmp_path / "nowhere.gguf")


@pytest.mark.parametrize("content", [b"", b"PK\x03\x04 a zip file, not a model", b"GGU"])
def test_a_file_that_is_not_gguf(tmp_path, monkeypatch, home, content):
    path = tmp_path / "model.gguf"
    path.write_bytes(content)
    refused(path, ModelFileError, monkeypatch, home, "is not a GGUF file")


def test_a_file_without_the_gguf_suffix_is_read_as_one(files, f32_model, tmp_path):
    path = shutil.copyfile(files["f32"], tmp_path / "sha256-0123abcd")  # how Ollama names its blobs
    model = load_model(str(path), weights="float32")
    assert model.name == "sha256-0123abcd" and model.fingerprint.split("@")[1] == f32_model.fingerprint.split("@")[1]
    elf = tmp_path / "sha256-4567cdef"
    elf.write_bytes(b"\x7fELF" + bytes(100))
    with pytest.raises(ModelFileError, match="is not a GGUF file"):
        load_model(str(elf))


@pytest.mark.parametrize("keep", [0.03, 0.5, 0.99])
def test_a_truncated_file(files, tmp_path, monkeypatch, home, keep):
    data = files["f32"].read_bytes()
    path = tmp_path / "cut.gguf"
    path.write_bytes(data[: int(len(data) * keep)])
    refused(path, ModelFileError, monkeypatch, home, "truncated or corrupt")


@pytest.mark.parametrize(
    ("offset", "value", "fragment"),
    [
        (4, 7, "GGUF version 7"),  # the version
        (8, 2**50, "claims"),  # the tensor count
        (16, 2**40, "claims"),  # the metadata count
        (24, 2**40, "truncated or corrupt"),  # the length of the first key
    ],
)
def test_a_corrupt_header(files, tmp_path, monkeypatch, home, offset, value, fragment):
    data = bytearray(files["f32"].read_bytes())
    width = 4 if offset == 4 else 8
    data[offset : offset + width] = value.to_bytes(width, "little")
    path = tmp_path / "corrupt.gguf"
    path.write_bytes(bytes(data))
    refused(path, ModelFileError, monkeypatch, home, fragment)


def test_an_architecture_transformers_cannot_read(reference, tmp_path, monkeypatch, home):
    path = write_tiny_gguf(tmp_path / "rwkv.gguf", reference, architecture="rwkv7")
    error = refused(path, UnsupportedArchitectureError, monkeypatch, home, "transformers cannot read")
    assert error.architecture == "rwkv7" and "llama" in error.supported and "qwen3" in error.supported


def test_an_architecture_turncache_refuses(reference, tmp_path, monkeypatch, home):
    path = write_tiny_gguf(tmp_path / "mamba.gguf", reference, architecture="mamba")
    error = refused(path, UnsupportedArchitectureError, monkeypatch, home, "Mamba-1")
    assert error.architecture == "mamba" and "mamba" not in error.supported and "llama" in error.supported


def test_a_tensor_type_transformers_cannot_dequantize(reference, tmp_path, monkeypatch, home):
    extra = {"blk.0.extra_scale.weight": np.ones(32, dtype=np.float64)}  # written as F64
    path = write_tiny_gguf(tmp_path / "f64.gguf", reference, extra_tensors=extra)
    refused(path, ModelFileError, monkeypatch, home, "F64", "blk.0.extra_scale.weight", "Q8_0")


def test_a_tensor_of_a_type_nobody_knows(files, tmp_path, monkeypatch, home):
    data = bytearray(files["f32"].read_bytes())
    name = b"token_embd.weight"
    at = data.index(len(name).to_bytes(8, "little") + name) + 8 + len(name)  # in the tensor table: dims, shape, type
    dims = int.from_bytes(data[at : at + 4], "little")
    at += 4 + 8 * dims
    data[at : at + 4] = (200).to_bytes(4, "little")
    path = tmp_path / "unknown-type.gguf"
    path.write_bytes(bytes(data))
    refused(path, ModelFileError, monkeypatch, home, "tensor token_embd.weight has the unknown ggml type id 200")


def test_one_part_of_a_split_file(reference, tmp_path, monkeypatch, home):
    path = write_tiny_gguf(tmp_path / "m-00001-of-00002.gguf", reference, metadata={"split.no": 0, "split.count": 2})
    refused(path, ModelFileError, monkeypatch, home, "part 1 of a GGUF split into 2 files", "--merge")


def test_a_vocabulary_only_file(reference, tmp_path, monkeypatch, home):
    path = write_tiny_gguf(tmp_path / "vocab.gguf", reference, weights=False)
    refused(path, ModelFileError, monkeypatch, home, "holds no tensors")


def test_the_command_line_reports_a_bad_file_without_a_traceback(tmp_path, capsys):
    from chat.cli import main

    path = tmp_path / "nowhere.gguf"
    with pytest.raises(SystemExit) as info:
        main(["chat", "--model", str(path)])
    assert str(info.value.code).startswith(f"turncache: {path}: no such file")
