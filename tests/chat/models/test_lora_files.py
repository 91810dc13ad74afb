"""chat.models.lora_files: PEFT directories and llama.cpp GGUF LoRA files read into one form (PEFT's scaling rules,
the load scale, GGUF's row order), and every file or setting that is not served refused with AdapterFileError. Read
through the decoder's adapter bank, the way a server reads them."""

from __future__ import annotations

import json
import math

import pytest
import torch
from safetensors.torch import load_file, save_file

from chat.models.errors import AdapterFileError
from tests.chat.models.lora_helpers import (
    IDS,
    TOLERANCE,
    copy_adapter,
    forward,
    loaded,
    logits_of,
    make_peft_adapter,
    tiny_hf,
    write_gguf_lora,
)

pytest.importorskip("peft")


@pytest.mark.parametrize(
    "options",
    [
        {"use_rslora": True},
        {"rank_pattern": {"v_proj": 2, "layers.1.mlp.down_proj": 6}, "alpha_pattern": {"o_proj": 3}},
        {"layers_to_transform": [0, 2]},
    ],
    ids=["rslora", "patterns", "some-layers"],
)
def test_peft_scaling_rules(runtime, tmp_path, options):
    path, merged = make_peft_adapter(tmp_path / "a", seed=3, r=4, alpha=16, **options)
    adapter = loaded(runtime, "rules", path)
    (got,) = forward(runtime, [(runtime.new_run(adapter=adapter), IDS)])
    assert (got - logits_of(merged, IDS)).abs().max().item() <= TOLERANCE


def test_scale_multiplies_the_update(runtime, adapters):
    path, merged = adapters["one"]
    half = loaded(runtime, "half", path, 0.5)
    (got,) = forward(runtime, [(runtime.new_run(adapter=half), IDS)])
    reference = _merged_with_scale(path, 0.5)
    assert (got - logits_of(reference, IDS)).abs().max().item() <= TOLERANCE
    assert (got - logits_of(merged, IDS)).abs().max().item() > 100 * TOLERANCE
    runtime.adapters.remove("half")


def _merged_with_scale(path, scale):
    from peft import PeftModel

    model = PeftModel.from_pretrained(tiny_hf("llama"), str(path))
    for module in model.modules():
        if hasattr(module, "scaling") and isinstance(module.scaling, dict):
            for key in module.scaling:
                module.scaling[key] *= scale
    return model.merge_and_unload().eval()


def test_gguf_lora_file_equals_peft_directory(runtime, adapters, tmp_path):
    path, merged = adapters["one"]
    gguf_path = write_gguf_lora(path, tmp_path / "one.gguf", runtime._model.config)
    adapter = loaded(runtime, "one-gguf", gguf_path)
    (got,) = forward(runtime, [(runtime.new_run(adapter=adapter), IDS)])
    assert (got - logits_of(merged, IDS)).abs().max().item() <= TOLERANCE
    assert adapter.identity == runtime.adapters.read("x", str(path)).identity  # the same update, the same identity
    runtime.adapters.remove("one-gguf")


@pytest.mark.parametrize(
    "change, message",
    [
        ({"use_dora": True}, "use_dora"),
        ({"modules_to_save": ["lm_head"]}, "modules_to_save"),
        ({"bias": "all"}, "bias"),
        ({"peft_type": "IA3"}, "peft_type"),
    ],
)
def test_settings_not_served_are_refused(runtime, adapters, tmp_path, change, message):
    out = copy_adapter(adapters["one"][0], tmp_path / "x")
    config = json.loads((out / "adapter_config.json").read_text())
    config.update(change)
    (out / "adapter_config.json").write_text(json.dumps(config))
    with pytest.raises(AdapterFileError, match=message):
        runtime.adapters.read("x", str(out))


def test_bad_paths_and_files(runtime, adapters, tmp_path):
    with pytest.raises(AdapterFileError, match="no such adapter"):
        runtime.adapters.read("x", str(tmp_path / "missing"))
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(AdapterFileError, match=r"adapter_config\.json"):
        runtime.adapters.read("x", str(empty))
    out = copy_adapter(adapters["one"][0], tmp_path / "corrupt")
    (out / "adapter_model.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json")
    with pytest.raises(AdapterFileError, match="safetensors"):
        runtime.adapters.read("x", str(out))
    (out / "adapter_config.json").write_text("{")
    with pytest.raises(AdapterFileError, match="JSON"):
        runtime.adapters.read("x", str(out))
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"GGUF" + b"\x00" * 7)
    with pytest.raises(AdapterFileError):
        runtime.adapters.read("x", str(junk))
    with pytest.raises(AdapterFileError, match="finite"):
        runtime.adapters.read("x", str(adapters["one"][0]), math.inf)


def test_embedding_or_head_modules_are_refused(runtime, adapters, tmp_path):
    out = copy_adapter(adapters["one"][0], tmp_path / "head")
    tensors = load_file(str(out / "adapter_model.safetensors"))
    tensors["base_model.model.lm_head.lora_A.weight"] = torch.zeros(4, 64)
    tensors["base_model.model.lm_head.lora_B.weight"] = torch.zeros(10, 4)
    save_file(tensors, str(out / "adapter_model.safetensors"))
    with pytest.raises(AdapterFileError, match="lm_head"):
        runtime.adapters.read("x", str(out))


def test_a_gguf_model_file_is_not_an_adapter(runtime, tmp_path):
    import gguf

    path = tmp_path / "model.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_type("model")
    writer.add_tensor("blk.0.attn_q.weight", torch.zeros(64, 64).numpy())
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(AdapterFileError, match="not a GGUF LoRA adapter"):
        runtime.adapters.read("x", str(path))
