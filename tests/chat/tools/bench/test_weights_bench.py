"""``turncache bench weights --json`` on a tiny GGUF file: one JSON object on stdout with every format side by side
(the file's own blocks too), float32 as the reference, the default rule (quality, then the fastest) applied to the
run, the layers left in float32 and each format's resident memory in a fresh process."""

from __future__ import annotations

import json

import pytest

from chat.models.kernels import block_matrices, native
from chat.tools.bench.weights_bench import meets_rule, rule_choice
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
    assert result["formats"] == formats and result["default_format"] == "gguf-q16" and result["model"] == str(path)
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
    able = [w for w, ok in zip(formats, result["meets_default_rule"], strict=True) if ok]
    assert result["default_rule_format"] in able and "gguf" in able and "gguf-q16" in able
    assert result["float32_fallback_layers"] == 0  # every linear layer of a Q4_1 file keeps its blocks
    idle, loaded = figures["rss_idle_mib"], figures["rss_loaded_mib"]
    assert all(100 < idle[w] <= loaded[w] + 1 for w in formats)  # a process with torch: 100s of MiB
    assert idle["float32"] > idle["gguf-q16"]  # float32 keeps 4 bytes a weight, the blocks under 1 (measured)


def test_the_default_rule_takes_the_fastest_format_with_float32s_answers():
    good = {"next_token_agreement": 0.995, "perplexity_ratio": 1.004}
    assert meets_rule(good)
    assert not meets_rule({**good, "next_token_agreement": 0.98})
    assert not meets_rule({**good, "perplexity_ratio": 1.006})
    results = {
        "int8": {"next_token_agreement": 0.9, "perplexity_ratio": 1.02, "batch8_tokens_per_s": 500.0},
        "gguf": {**good, "batch8_tokens_per_s": 300.0},
        "gguf-q16": {**good, "batch8_tokens_per_s": 450.0},
    }
    assert rule_choice(results) == "gguf-q16"  # int8 is faster, but does not answer like float32
    results["gguf"]["batch8_tokens_per_s"] = 460.0
    assert rule_choice(results) == "gguf"
    assert rule_choice({"int8": results["int8"]}) is None
