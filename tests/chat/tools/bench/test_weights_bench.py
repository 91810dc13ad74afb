"""``turncache bench weights --json`` on a tiny GGUF file: one JSON object on stdout with every format side by side
(the file's own blocks too), float32 as the reference, the default rule applied to int8's speeds of the same run."""

from __future__ import annotations

import json

import pytest

from chat.models import block_matrices, native
from chat.tools.bench.weights_bench import meets_rule
from tests.chat.models.gguf_helpers import reference_llama, write_tiny_gguf


@pytest.fixture(autouse=True)
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("TURNCACHE_HOME", str(tmp_path / "home"))


def test_the_json_path_measures_every_format_against_float32(tmp_path, capsys):
    from chat.cli import main

    path = write_tiny_gguf(tmp_path / "tiny-q4_1.gguf", reference_llama(), qtype="Q4_1")
    assert main(["bench", "weights", "--json", "--model", str(path), "--rounds", "1"]) == 0
    result = json.loads(capsys.readouterr().out)  # the whole of stdout: one object
    formats = ["float32", "bfloat16", "int8", "gguf", "gguf-q16", "gguf-q8"]
    assert result["formats"] == formats and result["default_format"] == "gguf" and result["model"] == str(path)
    per_format = [key for key, value in result.items() if isinstance(value, list) and len(value) == len(formats)]
    figures = {key: dict(zip(formats, result[key], strict=True)) for key in per_format}
    assert figures["next_token_agreement"]["float32"] == 1.0 and figures["perplexity_ratio"]["float32"] == 1.0
    assert figures["next_token_agreement"]["gguf"] >= 0.99  # the file's weights, exactly
    assert abs(figures["perplexity_ratio"]["gguf"] - 1.0) < 1e-3
    for key in ("decode_tokens_per_s", "batch8_tokens_per_s", "prefill_tokens_per_s"):
        assert all(v > 0 for v in figures[key].values()), key
    blocks_kv = "float16" if block_matrices.kernels() is not None else "float32"
    int8_kv = "float16" if native.kernels() is not None else "float32"
    assert result["kv_dtypes"] == ["float32", "float32", int8_kv, blocks_kv, blocks_kv, blocks_kv]
    assert len(result["meets_default_rule"]) == 6 and isinstance(result["load_average"], list) and result["cpu"]
    assert result["rounds"] == 1


def test_the_default_rule_needs_quality_and_int8s_speed():
    int8 = {"decode_tokens_per_s": 100.0, "batch8_tokens_per_s": 400.0}
    good = {"next_token_agreement": 0.995, "perplexity_ratio": 1.004, "decode_tokens_per_s": 101.0}
    assert meets_rule({**good, "batch8_tokens_per_s": 400.0}, int8)
    assert not meets_rule({**good, "batch8_tokens_per_s": 399.0}, int8)
    assert not meets_rule({**good, "batch8_tokens_per_s": 500.0, "next_token_agreement": 0.98}, int8)
    assert not meets_rule({**good, "batch8_tokens_per_s": 500.0, "perplexity_ratio": 1.006}, int8)
    assert not meets_rule({**good, "batch8_tokens_per_s": 500.0, "decode_tokens_per_s": 99.0}, int8)
