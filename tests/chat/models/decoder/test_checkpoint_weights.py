"""chat.models.decoder.checkpoint_weights: a model directory's safetensors checkpoint read straight into the decoder
through its one name map, held against the path it replaces (transformers' model, then its state dict):

- in every dense format (float32, bfloat16, int8 with its smoothing calibration), one file or shards, a tied or an
  untied head, the model gives bit for bit the logits, the fingerprint, the EOS ids and the generation defaults of
  the path through transformers, and builds no transformers model;
- what it cannot read goes to that path, logged: a ``.bin`` checkpoint, a tensor its map does not know, an untied
  config without a head, a family the decoder does not compute;
- a checkpoint file that is not safetensors or is truncated, a shard the index lists that is missing, and a shard
  that lacks what the index places in it are typed errors naming the file."""

from __future__ import annotations

import json
import logging
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from chat.models import ModelLoadError, load_model
from chat.models import registry as registry_module
from chat.models.decoder import checkpoint_weights
from chat.models.renderer_loading import tiny_text
from chat.models.tiny.text import build_tiny_model

TOKENS = list(range(5, 29))  # 24 tokens: more rows than float32's few-rows BLAS forms take (they are timed per load)
FORMATS = [("float32", "float32"), ("bfloat16", "bfloat16"), ("float32", "int8")]  # (dtype, weights)
GENERATION = {"do_sample": True, "temperature": 0.6, "top_p": 0.9, "eos_token_id": [2, 7]}


def save_tiny(name: str, path, *, tied: bool = False, shard: str | None = None) -> None:
    """``tiny-<name>``'s weights and tokenizer as a model directory (``shard``: save_pretrained's max_shard_size)."""
    tokenizer, config = tiny_text(name)
    config.tie_word_embeddings = tied
    model = build_tiny_model(config, torch.float32)
    model.save_pretrained(str(path), **({"max_shard_size": shard} if shard else {}))
    tokenizer.save_pretrained(str(path))


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    """One file, untied (llama); shards, tied (gemma3: sandwich norms, q/k norms, sliding layers); shards, untied, q/k/v
    biases and a generation config of its own (qwen2)."""
    root = tmp_path_factory.mktemp("checkpoints")
    save_tiny("llama", root / "llama")
    save_tiny("gemma3", root / "gemma3-tied", tied=True, shard="100KB")
    save_tiny("qwen2", root / "qwen2", shard="100KB")
    (root / "qwen2" / "generation_config.json").write_text(json.dumps(GENERATION))
    assert (
        len(list((root / "gemma3-tied").glob("*.safetensors"))) > 1 and (root / "llama" / "model.safetensors").is_file()
    )
    return root


def logits(model) -> torch.Tensor:
    run = model.new_run()
    try:
        return model.forward(run, TOKENS)
    finally:
        model.close_run(run)


def direct(path, dtype="float32", weights=None):
    """Loaded straight from the checkpoint: transformers' model is never built."""

    def refuse(*_args, **_kwargs):
        raise AssertionError("transformers' model was built")

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(registry_module.AutoModelForCausalLM, "from_pretrained", refuse)
        return load_model(str(path), dtype, weights)


def through_transformers(path, dtype="float32", weights=None):
    """The path the direct read replaces: transformers' model, its state dict into the decoder."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(checkpoint_weights, "build_from_directory", lambda *_args, **_kwargs: None)
        return load_model(str(path), dtype, weights)


def assert_same(one, other) -> None:
    assert type(one).__name__ == type(other).__name__ == "DecoderAdapter"
    assert torch.equal(logits(one), logits(other))
    assert one.fingerprint == other.fingerprint
    assert one.eos_token_ids == other.eos_token_ids and one.context_window == other.context_window
    assert one.generation_defaults == other.generation_defaults


@pytest.mark.parametrize("name", ["llama", "gemma3-tied"])
@pytest.mark.parametrize(("dtype", "weights"), FORMATS)
def test_a_directory_gives_the_logits_of_the_path_through_transformers(dirs, name, dtype, weights):
    assert_same(direct(dirs / name, dtype, weights), through_transformers(dirs / name, dtype, weights))


def test_shards_with_biases_and_a_generation_config(dirs):
    model = direct(dirs / "qwen2")
    assert_same(model, through_transformers(dirs / "qwen2"))
    assert model.generation_defaults["temperature"] == pytest.approx(0.6) and {2, 7} <= model.eos_token_ids


def test_without_a_generation_config_its_settings_come_from_the_config(dirs, tmp_path):
    shutil.copytree(dirs / "llama", tmp_path / "m")
    (tmp_path / "m" / "generation_config.json").unlink()
    config = json.loads((tmp_path / "m" / "config.json").read_text())
    (tmp_path / "m" / "config.json").write_text(json.dumps({**config, "eos_token_id": [2, 9]}))
    model = direct(tmp_path / "m")
    assert_same(model, through_transformers(tmp_path / "m"))
    assert 9 in model.eos_token_ids


def test_a_tied_config_whose_checkpoint_holds_a_head_of_its_own_gets_that_head(dirs, tmp_path):
    """As transformers reads it: a head of other values than the embedding is kept (transformers unties them)."""
    shutil.copytree(dirs / "llama", tmp_path / "m")
    config = json.loads((tmp_path / "m" / "config.json").read_text())
    (tmp_path / "m" / "config.json").write_text(json.dumps({**config, "tie_word_embeddings": True}))
    model = direct(tmp_path / "m")
    assert_same(model, through_transformers(tmp_path / "m"))
    assert torch.equal(logits(model), logits(direct(dirs / "llama")))  # the head is the file's, not the embedding


# ==================================================================== what goes to transformers' path


def read_through_transformers(path, caplog, why: str):
    """Loaded through transformers' model, the reason logged."""
    with caplog.at_level(logging.INFO, logger=checkpoint_weights.__name__):
        model = load_model(str(path))
    assert f"{path} is read through transformers' model" in caplog.text and why in caplog.text
    return model


def test_what_the_decoder_does_not_read_goes_through_transformers(dirs, tmp_path, caplog):
    for case in ("bin", "unknown", "headless"):
        shutil.copytree(dirs / "llama", tmp_path / case)
    state = load_file(str(dirs / "llama" / "model.safetensors"))
    torch.save(state, tmp_path / "bin" / "pytorch_model.bin")
    (tmp_path / "bin" / "model.safetensors").unlink()
    save_file({**state, "model.extra.weight": torch.ones(3)}, str(tmp_path / "unknown" / "model.safetensors"))
    headless = {name: t for name, t in state.items() if name != "lm_head.weight"}
    save_file(headless, str(tmp_path / "headless" / "model.safetensors"), metadata={"format": "pt"})
    expected = logits(direct(dirs / "llama"))
    assert torch.equal(
        logits(read_through_transformers(tmp_path / "bin", caplog, "holds no model.safetensors")), expected
    )
    unknown = read_through_transformers(tmp_path / "unknown", caplog, "'model.extra.weight'")
    assert torch.equal(logits(unknown), expected)  # transformers drops the tensor it does not know
    read_through_transformers(tmp_path / "headless", caplog, "no lm_head.weight")  # its head: random values


def test_a_family_the_decoder_does_not_compute_opens_no_file(tmp_path, caplog):
    (tmp_path / "model.safetensors").write_bytes(b"not read")
    tokenizer, config = tiny_text("lfm2")
    with caplog.at_level(logging.INFO, logger=checkpoint_weights.__name__):
        assert (
            checkpoint_weights.build_from_directory(tmp_path, config, tokenizer, "float32", dtype=torch.float32) is None
        )
    assert "lfm2" in caplog.text


# ==================================================================== files that cannot be read


def test_a_truncated_or_corrupt_file_is_a_typed_error_naming_it(dirs, tmp_path):
    shutil.copytree(dirs / "llama", tmp_path / "m")
    single = tmp_path / "m" / "model.safetensors"
    single.write_bytes(single.read_bytes()[:-100])
    with pytest.raises(ModelLoadError, match=r"model\.safetensors"):
        load_model(str(tmp_path / "m"))
    shutil.copytree(dirs / "gemma3-tied", tmp_path / "s")
    shard = sorted((tmp_path / "s").glob("model-*.safetensors"))[1]
    shard.write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00not json")
    with pytest.raises(ModelLoadError, match=shard.name):
        load_model(str(tmp_path / "s"))


def test_a_missing_shard_is_a_typed_error_naming_it(dirs, tmp_path):
    shutil.copytree(dirs / "gemma3-tied", tmp_path / "s")
    shard = sorted((tmp_path / "s").glob("model-*.safetensors"))[-1]
    shard.unlink()
    with pytest.raises(ModelLoadError, match=f"shard {shard.name} .* is missing"):
        load_model(str(tmp_path / "s"))


def test_a_shard_without_what_the_index_places_there_is_a_typed_error(dirs, tmp_path):
    shutil.copytree(dirs / "gemma3-tied", tmp_path / "s")
    index = json.loads((tmp_path / "s" / checkpoint_weights.INDEX_FILE).read_text())
    name, shard = next(iter(index["weight_map"].items()))
    other = next(s for s in sorted(set(index["weight_map"].values())) if s != shard)
    index["weight_map"][name] = other
    (tmp_path / "s" / checkpoint_weights.INDEX_FILE).write_text(json.dumps(index))
    with pytest.raises(ModelLoadError, match=f"{other} lacks {name}"):
        load_model(str(tmp_path / "s"))
