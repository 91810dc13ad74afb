"""chat.models.decoder.gguf_weights: a GGUF file read straight into the decoder's weights through its one name map,
held against transformers' own loading of the same file (which stays, as the loader of the families the decoder
does not read and as this oracle):

- tensor by tensor, the weights it reads are those transformers' loader fills its model with (its name map and its
  tensor processors), under the checkpoint map's names; the blocks it keeps are the bytes transformers' path keeps;
- a model loaded from the file gives, bit for bit, the logits and the fingerprint of the same file loaded through
  transformers' model and the checkpoint names (``build_from_file`` off: the path it replaces), in every
  weight format, and builds no transformers model;
- tiny files: a llama (q/k rows interleaved) in Q8_0 and F32, a Qwen3 (q/k norms), a wide llama in llama.cpp's
  Q4_K_M mix; the real files are in test_real_gguf_files.py."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from chat.models import gguf_files, load_model
from chat.models.decoder import gguf_weights
from chat.models.decoder.model import decoder_args
from chat.models.hf import gguf_model
from chat.models.kernels import block_matrices
from tests.chat.models.decoder.gguf_checks import assert_read_as_transformers_reads, assert_same_model
from tests.chat.models.gguf_helpers import reference_llama, reference_qwen3, reference_wide_llama, write_tiny_gguf

FORMATS = ["float32", "bfloat16", "int8", "gguf", "gguf-q8", "gguf-q16"]
needs_kernels = pytest.mark.skipif(block_matrices.kernels() is None, reason="no native block kernels on this machine")


@pytest.fixture(scope="module", autouse=True)
def home(tmp_path_factory):
    torch.set_num_threads(1)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TURNCACHE_HOME", str(tmp_path_factory.mktemp("turncache-home")))
        yield


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    folder = tmp_path_factory.mktemp("gguf-names")
    return {
        "llama-q8_0": write_tiny_gguf(folder / "llama-q8_0.gguf", reference_llama(), qtype="Q8_0"),
        "llama-f32": write_tiny_gguf(folder / "llama-f32.gguf", reference_llama()),
        "qwen3-q8_0": write_tiny_gguf(folder / "qwen3-q8_0.gguf", reference_qwen3(), qtype="Q8_0"),
        "wide-q4_k_m": write_tiny_gguf(folder / "wide-q4_k_m.gguf", reference_wide_llama(), qtype="Q4_K_M"),
    }


# ==================================================================== tiny files


@pytest.mark.parametrize("name", ["llama-q8_0", "qwen3-q8_0", "wide-q4_k_m"])
@pytest.mark.parametrize("blocks", [False, True])
def test_the_file_is_read_as_transformers_loads_it(files, name, blocks):
    assert_read_as_transformers_reads(files[name], blocks)


@pytest.mark.parametrize("weights", FORMATS)
def test_a_tiny_llama_gives_the_logits_of_the_path_through_transformers(files, weights):
    path = str(files["llama-q8_0"])
    assert_same_model(path, list(range(5, 45)), weights=weights)


@needs_kernels
@pytest.mark.parametrize("weights", ["gguf", "gguf-q16"])
def test_a_k_quant_mix_and_a_qwen3_give_the_logits_of_the_path_through_transformers(files, weights):
    assert_same_model(str(files["wide-q4_k_m"]), list(range(5, 45)), weights=weights)
    assert_same_model(str(files["qwen3-q8_0"]), list(range(5, 45)), weights=weights)


def test_a_bfloat16_model_gives_the_logits_of_the_path_through_transformers(files):
    assert_same_model(str(files["llama-f32"]), list(range(5, 45)), dtype="bfloat16")


def test_the_decoder_reads_the_file_without_transformers_model(files, monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("a transformers model was built")

    monkeypatch.setattr(gguf_model, "load_gguf", refuse)
    model = load_model(str(files["llama-q8_0"]), weights="gguf-q16")
    assert type(model._model).__name__ == "Decoder"


def test_a_tensor_the_map_does_not_know_goes_through_transformers(tmp_path, monkeypatch):
    """Not a guess: a tensor outside GGUF_NAMES sends the file to transformers' loader, which serves it as before."""
    extra = {"blk.0.attn_sinks.weight": np.ones(8, dtype=np.float32)}
    path = write_tiny_gguf(tmp_path / "extra.gguf", reference_llama(), extra_tensors=extra)
    header = gguf_files.read_header(path)
    config, _ = gguf_model.metadata(path, header, None)
    with pytest.raises(gguf_weights.NotPackable, match="attn_sinks"):
        gguf_weights.read_weights(path, header, decoder_args(config), tied=config.tie_word_embeddings, blocks=False)
    calls = []
    original = gguf_model.load_gguf
    monkeypatch.setattr(gguf_model, "load_gguf", lambda *args: calls.append(args) or original(*args))
    model = load_model(str(path), weights="float32")
    assert calls and type(model._model).__name__ == "Decoder"
