"""chat.models.registry: a spec to its loader, and the loader's imports. The settings a load is asked for are checked
by chat.models.specs (test_specs.py); loading itself is tested per path (test_text.py, test_smollm2.py,
test_gguf_files.py, hf/test_multimodal.py, ...)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from chat.models.errors import UnknownModelError
from chat.models.registry import load_model
from tests.chat.models.gguf_helpers import reference_llama, write_tiny_gguf


@pytest.mark.parametrize("spec", ["", "   ", None, 3, "tiny-nonesuch", "/no/such/directory"])
def test_a_spec_that_names_no_model_is_unknown(spec):
    with pytest.raises(UnknownModelError):
        load_model(spec)


def test_a_model_on_the_own_decoder_loads_none_of_transformers_forward(tmp_path):
    """The loader names transformers' forward at its top (chat.models.hf.FORWARD), yet a GGUF file the own decoder
    reads imports neither that forward nor transformers' modeling (~1.1 s: what the default model's load is spared);
    a hybrid recurrent model, which only transformers computes, then brings them in."""
    path = write_tiny_gguf(tmp_path / "llama.gguf", reference_llama())
    code = (
        "import json, sys, torch\ntorch.set_num_threads(1)\n"
        "from chat.models.registry import load_model\n"
        "heavy = ('chat.models.hf.runtime', 'chat.models.hf.multimodal', 'transformers.modeling_utils')\n"
        f"own = type(load_model({str(path)!r})).__name__\n"
        "before = [m for m in heavy if m in sys.modules]\n"
        "hybrid = type(load_model('tiny-qwen3next')).__name__\n"
        "print(json.dumps([own, before, hybrid, [m for m in heavy if m in sys.modules]]))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    own, before, hybrid, after = json.loads(done.stdout.strip().splitlines()[-1])
    assert (own, before) == ("DecoderAdapter", [])
    assert hybrid == "TransformersAdapter" and {"chat.models.hf.runtime", "transformers.modeling_utils"} <= set(after)
