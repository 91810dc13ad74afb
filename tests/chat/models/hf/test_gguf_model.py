"""chat.models.hf.gguf_model through its public functions (its internals are being reworked): a GGUF file loaded
straight from its bytes is transformers' model of the same weights (float32 logits of the reference model), keeps
its blocks for a block format, reuses the metadata parsed for the same bytes, and gives its tokenizer alone. Loading
through load_model and the file checks are in test_gguf_files.py and test_gguf_blocks.py."""

from __future__ import annotations

import pytest
import torch

from chat.models.errors import ModelFileError
from chat.models.hf import gguf_model, metadata_store
from chat.models.tiny.tokenizer import CHAT_TEMPLATE
from tests.chat.models.gguf_helpers import dequantized_copy, reference_llama, write_tiny_gguf

torch.set_num_threads(1)
TOKENS = [5, 17, 99, 3, 250, 42, 7, 8]


def logits(model: torch.nn.Module) -> torch.Tensor:
    with torch.no_grad():
        return model(torch.tensor([TOKENS])).logits[0].float()


@pytest.fixture(autouse=True)
def home(tmp_path, monkeypatch):
    """Digests and kept metadata of each test go to a fresh $TURNCACHE_HOME (one test keys a file by a made-up
    digest)."""
    monkeypatch.setenv("TURNCACHE_HOME", str(tmp_path))
    metadata_store.forget_in_memory()


@pytest.fixture(scope="module")
def reference():
    return reference_llama()


@pytest.fixture(scope="module")
def files(tmp_path_factory, reference):
    folder = tmp_path_factory.mktemp("gguf-model")
    return {
        "f32": write_tiny_gguf(folder / "f32.gguf", reference),
        "q8_0": write_tiny_gguf(folder / "q8.gguf", reference, qtype="Q8_0"),
        "vocab": write_tiny_gguf(folder / "vocab.gguf", reference, weights=False),
    }


def test_a_float32_file_is_the_reference_models_forward(files, reference):
    model, tokenizer = gguf_model.load_gguf(files["f32"], "float32")
    assert not model.training and next(model.parameters()).dtype == torch.float32
    assert (logits(model) - logits(reference)).abs().max().item() < 1e-5
    assert not gguf_model.all_in_blocks(model)
    assert tokenizer.chat_template == CHAT_TEMPLATE


def test_a_quantized_file_dequantizes_to_its_blocks_values(files, reference):
    model, _ = gguf_model.load_gguf(files["q8_0"], "float32")
    expected = logits(dequantized_copy(reference, "Q8_0"))
    assert (logits(model) - expected).abs().max().item() < 1e-4
    assert (logits(model) - logits(reference)).abs().max().item() > 1e-4  # the blocks' rounding shows


def test_a_block_format_keeps_every_linear_layers_blocks(files):
    model, _ = gguf_model.load_gguf(files["q8_0"], "gguf")
    assert gguf_model.all_in_blocks(model)


def test_the_same_bytes_reuse_fresh_copies_of_their_metadata(files, monkeypatch):
    digest = "0" * 64  # any stable key for these bytes
    first, tokenizer = gguf_model.load_gguf(files["f32"], "float32", digest)
    parses = []
    monkeypatch.setattr(gguf_model, "load_tokenizer", lambda path: parses.append(path))
    second, again = gguf_model.load_gguf(files["f32"], "float32", digest)
    assert parses == []  # not parsed again
    assert again is not tokenizer and again.encode("café") == tokenizer.encode("café")  # a copy
    assert second.config is not first.config and second.config.to_dict() == first.config.to_dict()


def test_the_tokenizer_alone_of_a_checked_file(files):
    tokenizer = gguf_model.checked_tokenizer(files["f32"])
    assert tokenizer.chat_template == CHAT_TEMPLATE
    ids = tokenizer.encode("The capital of France is Paris.", add_special_tokens=False)
    assert tokenizer.decode(ids) == "The capital of France is Paris."
    with pytest.raises(ModelFileError, match="holds no tensors"):  # a vocabulary-only file is no model
        gguf_model.checked_tokenizer(files["vocab"])


def test_a_file_that_is_not_gguf_is_refused_before_parsing(tmp_path):
    path = tmp_path / "junk.gguf"
    path.write_bytes(b"not a gguf file at all")
    with pytest.raises(ModelFileError):
        gguf_model.checked_tokenizer(path)
