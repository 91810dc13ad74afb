"""The real GGUF files read straight into the own decoder through its one name map (chat.models.decoder.names,
chat.models.decoder.gguf_weights) give what they gave through transformers' model and the checkpoint names, bit for
bit: the built-in SmolLM2 (llama: q/k rows interleaved) in every weight format, Gemma 3 270M (norms stored as 1 + w,
sandwich norms, q/k norms) in its block formats; and each file's tensors are those transformers' loader reads."""

from __future__ import annotations

import pytest

from chat.models import gemma3_270m, smollm2
from tests.chat.models.decoder.gguf_checks import assert_read_as_transformers_reads, assert_same_model

pytestmark = pytest.mark.slow
FORMATS = ["float32", "bfloat16", "int8", "gguf", "gguf-q8", "gguf-q16"]


@pytest.mark.parametrize("weights", FORMATS)
def test_smollm2_gives_the_logits_of_the_path_through_transformers(weights):
    assert_same_model(smollm2.NAME, list(range(100, 130)), weights=weights)


def test_smollm2_in_bfloat16_gives_the_logits_of_the_path_through_transformers():
    assert_same_model(smollm2.NAME, list(range(100, 130)), dtype="bfloat16")


def test_smollm2_is_read_as_transformers_loads_it():
    assert_read_as_transformers_reads(smollm2.locate_gguf(), blocks=True)


@pytest.mark.parametrize("weights", ["gguf", "gguf-q16"])
def test_gemma3_gives_the_logits_of_the_path_through_transformers(weights):
    assert_same_model(gemma3_270m.NAME, list(range(1000, 1030)), weights=weights)


def test_gemma3_is_read_as_transformers_loads_it():
    """Its norms (stored as 1 + w), its embedding and every matrix's blocks."""
    assert_read_as_transformers_reads(gemma3_270m.locate_gguf(), blocks=True)
