"""chat.models.renderer_loading: ``load_renderer`` gives a model's name, media kinds and chat template without its
weights, rendering text messages to exactly the token ids of the full adapter (the cluster's routing keys must be what
the replicas render), and imports none of the runtimes."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from chat.models import UnknownModelError, UnsupportedArchitectureError, load_model, load_renderer
from chat.models.tiny.text import TINY_REFUSED
from chat.tools.testing.baselines import save_stock
from tests.chat.models.gguf_helpers import reference_llama, write_tiny_gguf
from tests.chat.models.helpers import ALL_TINY, tiny
from tests.chat.models.mm_helpers import MULTIMODAL, save_tiny

CONVERSATIONS = [
    [{"role": "user", "content": "Hi"}],
    [
        {"role": "system", "content": "You are brief. Voilà: 漢字 and 𝄞, ñ, Привет 🙂."},
        {"role": "user", "content": "What is the sea?\n\nAnswer in  two   words."},
        {"role": "assistant", "content": "Salt water."},
        {"role": "user", "content": "<|im_start|> and <image> typed by a user"},
    ],
    [{"role": "system", "content": ""}, {"role": "user", "content": " leading and trailing spaces "}],
]


def same_renderings(renderer, adapter) -> None:
    assert renderer.name == adapter.name
    assert renderer.modalities == adapter.modalities
    for messages in CONVERSATIONS:
        assert renderer.render(messages) == adapter.render(messages)
        assert renderer.render(messages, add_generation_prompt=False) == adapter.render(
            messages, add_generation_prompt=False
        )


@pytest.mark.parametrize("spec", ALL_TINY + MULTIMODAL)
def test_a_tiny_models_renderer_renders_as_its_adapter(spec):
    same_renderings(load_renderer(spec), tiny(spec))


def test_a_renderer_makes_no_weights(monkeypatch):
    def refuse(*_args, **_kwargs):
        raise AssertionError("a weight (torch.nn.Parameter) was made")

    monkeypatch.setattr(torch.nn.Parameter, "__new__", staticmethod(refuse))  # what every weight is made as
    renderers = [load_renderer(spec) for spec in ["tiny-llama", "tiny-qwen3next", *MULTIMODAL]]
    assert [r.name for r in renderers] == ["tiny-llama", "tiny-qwen3next", *MULTIMODAL]
    assert renderers[2].modalities == {"image", "audio", "video"} and renderers[3].modalities == {"image"}
    with pytest.raises(AssertionError, match="Parameter"):  # the check itself sees a model being built
        load_model("tiny-llama")


def test_a_renderer_refuses_what_load_model_refuses():
    for name in TINY_REFUSED:
        with pytest.raises(UnsupportedArchitectureError):
            load_renderer(f"tiny-{name}")
    for spec in ["tiny-nothing", "no-such-model", "", "  "]:
        with pytest.raises(UnknownModelError):
            load_renderer(spec)


def _weight_files(path) -> list:
    return [f for f in path.iterdir() if f.suffix in (".safetensors", ".bin")]


def test_a_text_directory_renders_as_its_adapter_without_its_weight_files(tmp_path):
    save_stock("tiny-llama", tmp_path)
    adapter = load_model(str(tmp_path))
    for f in _weight_files(tmp_path):
        f.unlink()
    same_renderings(load_renderer(str(tmp_path)), adapter)


@pytest.mark.parametrize("name", ["omni", "llava"])
def test_a_multimodal_directory_renders_as_its_adapter_without_its_weight_files(tmp_path, name):
    save_tiny(name, tmp_path)
    adapter = load_model(str(tmp_path))
    for f in _weight_files(tmp_path):
        f.unlink()
    renderer = load_renderer(str(tmp_path))
    same_renderings(renderer, adapter)
    assert renderer.modalities == tiny(f"tiny-{name}").modalities


@pytest.mark.slow
def test_the_built_in_models_renderer_renders_as_its_adapter():
    same_renderings(load_renderer("smollm2"), load_model("smollm2", weights="float32"))


def test_a_renderer_imports_none_of_the_runtimes(tmp_path):
    """What a cluster's ingress imports: neither the loader nor a runtime (the engine's grammar machinery,
    transformers' forward: seconds it never needs), for a GGUF file (the default model is one: not even transformers'
    modeling) and for a multimodal model (whose processors import transformers' modeling themselves)."""
    path = write_tiny_gguf(tmp_path / "llama.gguf", reference_llama())
    code = (
        "import json, sys\nfrom chat.models import load_renderer\n"
        "runtimes = ('chat.models.registry', 'chat.models.adapter', 'chat.models.decoder.runtime',"
        " 'chat.models.hf.runtime', 'chat.models.hf.multimodal', 'llguidance')\n"
        f"gguf = load_renderer({str(path)!r}).name\n"
        "modeling = 'transformers.modeling_utils' in sys.modules\n"
        "omni = load_renderer('tiny-omni').name\n"
        "print(json.dumps([gguf, modeling, omni, [m for m in runtimes if m in sys.modules]]))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout.strip().splitlines()[-1]) == ["llama", False, "tiny-omni", []]
