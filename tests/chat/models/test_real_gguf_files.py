"""The built-in SmolLM2 GGUF read straight into the own decoder through its one name map (chat.models.decoder.names,
chat.models.decoder.gguf_weights) gives what it gave through transformers' model and the checkpoint names, bit for
bit (llama: q/k rows interleaved), in float32 and the default block format, and its tensors are those transformers'
loader reads. Every weight format of the path is checked on tiny files (decoder/test_gguf_weights.py); Gemma 3 270M
(norms stored as 1 + w, sandwich norms) in test_gemma3_270m.py, on the model its tests load anyway."""

from __future__ import annotations

import pytest

from chat.models import smollm2
from tests.chat.models.decoder.gguf_checks import assert_read_as_transformers_reads, assert_same_model

pytestmark = pytest.mark.slow
FORMATS = ["float32", "gguf-q16"]


@pytest.mark.parametrize("weights", FORMATS)
def test_smollm2_gives_the_logits_of_the_path_through_transformers(weights):
    assert_same_model(smollm2.NAME, list(range(100, 130)), weights=weights)


def test_smollm2_is_read_as_transformers_loads_it():
    assert_read_as_transformers_reads(smollm2.locate_gguf(), blocks=True)
