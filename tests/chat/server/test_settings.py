"""chat.server.settings: what the server reads from flags and ``TURNCACHE_*`` variables, and what it refuses before
anything starts (each refusal names the setting)."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from chat.engine.volatile_lines import DEFAULT_PATTERNS
from chat.server.settings import YIELD_BUDGET_LEAST, ServerSettings


def refused(**fields) -> str:
    with pytest.raises(ValidationError) as caught:
        ServerSettings(**fields)
    (error,) = caught.value.errors()
    return f"{error['loc'][0]}: {error['msg']}"


def test_the_environment_gives_settings_and_flags_win(monkeypatch):
    monkeypatch.setenv("TURNCACHE_PORT", "8123")
    monkeypatch.setenv("TURNCACHE_MODEL", "tiny-llama")
    assert (ServerSettings().port, ServerSettings().model) == (8123, "tiny-llama")
    assert ServerSettings(port=9000).port == 9000
    monkeypatch.setenv("TURNCACHE_NOT_A_SETTING", "1")  # other variables of the prefix are not settings
    assert ServerSettings().port == 8123


def test_the_defaults_a_user_gets():
    settings = ServerSettings()
    assert (settings.host, settings.port, settings.model) == ("127.0.0.1", 8000, "smollm2")
    assert settings.volatile_lines == list(DEFAULT_PATTERNS) and settings.keep_volatile_lines is False
    assert settings.lora == [] and settings.served_model_aliases == [] and settings.sessions_db is None


def test_the_yield_budget_is_off_or_at_least_its_least():
    assert ServerSettings(yield_budget=0).yield_budget == 0
    assert ServerSettings(yield_budget=YIELD_BUDGET_LEAST).yield_budget == YIELD_BUDGET_LEAST
    assert refused(yield_budget=YIELD_BUDGET_LEAST - 1).startswith("yield_budget: Value error, must be 0 (off)")


def test_an_adapter_name_given_twice_or_a_malformed_spec_is_refused():
    assert ServerSettings(lora=["a=/x", "b=/y:0.5"]).lora == ["a=/x", "b=/y:0.5"]
    assert "an adapter name is given twice" in refused(lora=["a=/x", "a=/y"])
    assert "give NAME=PATH" in refused(lora=["no-path"])


@pytest.mark.parametrize(
    ("alias", "why"),
    [
        ("*", "would accept any model name"),
        ("?*?", "would accept any model name"),
        ("", "1 to 256 characters"),
        ("claude *", "no spaces"),
        ("c" * 257, "1 to 256 characters"),
    ],
)
def test_an_alias_that_accepts_any_name_or_is_malformed_is_refused(alias, why):
    assert why in refused(served_model_aliases=[alias])


def test_an_alias_with_a_prefix_is_kept():
    assert ServerSettings(served_model_aliases=["claude-*", "gpt-4o"]).served_model_aliases == ["claude-*", "gpt-4o"]


def test_a_volatile_line_pattern_that_does_not_compile_is_refused_by_name():
    assert ServerSettings(volatile_lines=[r"^x-billing: \d+$"]).volatile_lines == [r"^x-billing: \d+$"]
    assert refused(volatile_lines=["(unclosed"]).startswith("volatile_lines: ")


def test_media_hosts_are_kept_lowercased_and_a_malformed_one_is_refused():
    assert ServerSettings(media_url_hosts=[" Images.Example.com ", "*.cdn.example", "h:8443"]).media_url_hosts == [
        "images.example.com",
        "*.cdn.example",
        "h:8443",
    ]
    assert "is not a host name" in refused(media_url_hosts=["bad host"])


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("port", 65536),
        ("dtype", "float16"),
        ("media_url_timeout_s", 0),
        ("stream_buffer_events", 15),
        ("send_buffer_kib", 3),
        ("max_n", 0),
    ],
)
def test_values_out_of_range_are_refused_naming_the_setting(field, value):
    assert refused(**{field: value}).startswith(f"{field}: ")
