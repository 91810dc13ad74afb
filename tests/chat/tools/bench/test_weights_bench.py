import pytest

from chat.models import native
from chat.tools.bench.weights_bench import FORMATS, run


def test_weights_bench_measures_every_format_and_float16_kv_against_float32():
    result = run("tiny-llama")
    assert result["formats"] == list(FORMATS) == ["float32", "bfloat16", "int8"]
    agreement = dict(zip(FORMATS, result["next_token_agreement"], strict=True))
    assert agreement["float32"] == 1.0 and all(0.0 <= a <= 1.0 for a in agreement.values())
    assert all(p > 1.0 for p in result["perplexity"]) and all(r > 0 for r in result["decode_tokens_per_s"])
    int8_kv = "float16" if native.kernels() is not None else "float32"
    assert result["kv_dtypes"] == ["float32", "float32", int8_kv]
    assert 0.9 <= result["float16_kv_next_token_agreement"] <= 1.0
    assert result["float16_kv_perplexity"] == pytest.approx(result["perplexity"][0], rel=1e-2)
