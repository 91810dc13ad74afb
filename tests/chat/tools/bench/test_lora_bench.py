import pytest

from chat.tools.bench.lora_bench import TARGETS, LoraBenchConfig, run_on

pytest.importorskip("peft")

CFG = LoraBenchConfig(sessions=5, turns=2, min_user_words=4, max_user_words=8, reply_tokens=3, rounds=1)


@pytest.fixture(scope="module")
def result(tmp_path_factory):
    from chat.models import load_model

    return run_on(load_model("tiny-llama"), CFG, adapter_dir=tmp_path_factory.mktemp("bench-adapters"))


def test_the_keys_the_issue_names(result):
    for key in ("lora_tokens_per_s_ratio", "cached_ratio", "cross_adapter_hits", "errors", *TARGETS):
        assert key in result
    assert set(result["cached_ratio"]) == {"base", *result["adapters"]}
    assert result["weights"] == "float32"  # tiny-llama is no GGUF file: float32 by default
    assert result["errors"] == 0 and result["tokens_per_s_lora"] > 0 and result["tokens_per_s_base"] > 0


def test_probes_find_no_prefix_across_adapters_and_their_own_always(result):
    assert result["probes_cross"] == 5 * 4 and result["cross_adapter_hits"] == 0
    assert result["probes_own"] == 5 and result["own_adapter_probe_hits"] == 5


def test_an_adapter_caches_as_the_base_does(result):
    assert all(0 < ratio < 1 for ratio in result["cached_ratio"].values())
    assert result["cached_ratio_max_gap"] <= 0.02
