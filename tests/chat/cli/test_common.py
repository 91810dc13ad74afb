"""chat/cli/common.py: the model flags serve and chat share, and the value types of the bench flags."""

import argparse
import math

import pytest

from chat.cli.common import levels, model_flags, positive_float, positive_int


def test_levels_reads_comma_separated_session_counts():
    assert levels("1,8,32") == (1, 8, 32)
    assert levels("4") == (4,)


@pytest.mark.parametrize("text,says", [("1,x", "not a comma-separated list"), ("", "not a comma-separated list"),
                                       ("8,0", "at least 1"), ("-2", "at least 1")])  # fmt: skip
def test_levels_refuses_what_is_not_a_list_of_counts_of_at_least_one(text, says):
    with pytest.raises(argparse.ArgumentTypeError, match=says):
        levels(text)


def test_positive_int_takes_one_and_more_and_refuses_the_rest():
    assert positive_int("1") == 1 and positive_int("12") == 12
    for text, says in (("0", "at least 1"), ("-3", "at least 1"), ("2.5", "not an integer"), ("x", "not an integer")):
        with pytest.raises(argparse.ArgumentTypeError, match=says):
            positive_int(text)


def test_positive_float_takes_finite_numbers_above_zero_only():
    assert positive_float("0.25") == 0.25 and positive_float("5") == 5.0
    for text, says in (("0", "above 0"), ("-1", "above 0"), ("inf", "above 0"), ("nan", "above 0"), ("s", "number")):
        with pytest.raises(argparse.ArgumentTypeError, match=says):
            positive_float(text)
    assert not math.isnan(positive_float("1e-9"))


def _parsed(defaults: bool, *argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    model_flags(parser, defaults=defaults)
    return parser.parse_args(list(argv))


def test_model_flags_carry_the_commands_defaults_only_when_asked():
    own = _parsed(True)
    assert (own.model, own.dtype) == ("smollm2", "float32")
    assert own.weights is own.kv_dtype is own.chat_template is None  # chosen later, from the model
    left = _parsed(False)  # serve: its settings (environment, defaults) decide
    assert (left.model, left.dtype) == (None, None) and left.no_prefix_cache is False


def test_model_flags_read_each_flag_and_refuse_unknown_formats(capsys):
    args = _parsed(False, "--model", "tiny-llama", "--weights", "gguf-q8", "--kv-dtype", "float16", "--no-prefix-cache")
    assert (args.model, args.weights, args.kv_dtype, args.no_prefix_cache) == ("tiny-llama", "gguf-q8", "float16", True)
    with pytest.raises(SystemExit):
        _parsed(False, "--weights", "int4")
    assert "--weights" in capsys.readouterr().err
