import json

import pytest

from chat.cli import NOT_BUILT, main


@pytest.mark.parametrize("argv", [["eval"]])
def test_subcommands_not_built_say_so_and_fail(argv, capsys):
    assert main(argv) == NOT_BUILT
    out = capsys.readouterr()
    assert out.out == "" and "not built yet" in out.err


def test_bench_cache_prints_one_json_object_with_the_issue_keys(capsys):
    assert main(["bench", "cache", "--json", "--entries", "200"]) == 0
    result = json.loads(capsys.readouterr().out)
    for key in (
        "lookup_p99_ms",
        "linear_p99_ms",
        "lookup_speedup",
        "materialize_ms_4k",
        "conversation_bytes_ratio",
    ):
        assert isinstance(result[key], float) and result[key] > 0
    assert result["entries"] == 200
    assert result["linear_agreement"] == 1.0  # index and linear scan found the same prefix lengths
    assert result["conversation_bytes_ratio"] == pytest.approx(1.0)


def test_bench_cache_table_without_json(capsys):
    assert main(["bench", "cache", "--entries", "50"]) == 0
    out = capsys.readouterr().out
    assert "lookup_p99_ms" in out and not out.lstrip().startswith("{")
