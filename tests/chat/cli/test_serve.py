"""`turncache serve` (chat/cli/serve.py): its flags reach the server's settings, and a setting out of range is refused
naming its flag before anything loads. Its cluster flags: tests/chat/cluster/test_cli.py."""

import pytest

from chat.cli import build_parser, main
from chat.cli.serve import server_settings


def settings(*flags: str):
    """The server settings of `turncache serve FLAGS...`."""
    return server_settings(build_parser().parse_args(["serve", *flags]))


@pytest.mark.parametrize(
    "flags,named",
    [
        (["--max-batch", "0"], "--max-batch"),
        (["--max-batch", "1000"], "--max-batch"),
        (["--token-budget", "8"], "--token-budget"),
        (["--yield-budget", "1"], "--yield-budget"),
        (["--yield-budget", "-1"], "--yield-budget"),
        (["--yield-hold-s", "-1"], "--yield-hold-s"),
        (["--weights", "int4"], "--weights"),
        (["--kv-dtype", "int8"], "--kv-dtype"),
        (["--tenant-cache-share", "0"], "--tenant-cache-share"),
        (["--tenant-cache-share", "1.5"], "--tenant-cache-share"),
        (["--media-url-host", "not a host"], "--media-url-host:"),
        (["--media-url-timeout-s", "0"], "--media-url-timeout-s"),
        (["--send-buffer-kib", "1"], "--send-buffer-kib"),
        (["--served-model-alias", "*"], "--served-model-alias:"),
    ],
)
def test_serve_refuses_engine_settings_out_of_range_naming_the_setting(flags, named, monkeypatch, capsys):
    import chat.server.main

    monkeypatch.setattr(chat.server.main, "serve", lambda settings: pytest.fail("the server started"))
    with pytest.raises(SystemExit) as refused:
        main(["serve", "--model", "tiny-llama", *flags])
    message = str(refused.value) + capsys.readouterr().err
    assert named in message


def test_serve_flags_of_the_disk_tier(monkeypatch, tmp_path):
    monkeypatch.setenv("TURNCACHE_HOME", str(tmp_path))
    monkeypatch.delenv("TURNCACHE_CACHE_DIR", raising=False)
    default = settings()
    assert default.cache_dir == str(tmp_path / "prefix-cache") and default.disk_budget == 8 * 2**30
    off = settings("--cache-dir", "", "--disk-budget", "0")
    assert off.cache_dir == "" and off.disk_budget == 0
    with pytest.raises(SystemExit, match="--disk-budget"):
        settings("--disk-budget", "-1")


def test_the_kv_dtype_flag_and_its_environment_variable_reach_the_settings(monkeypatch):
    monkeypatch.delenv("TURNCACHE_KV_DTYPE", raising=False)
    assert settings().kv_dtype is None  # the model's default
    assert settings("--kv-dtype", "float32").kv_dtype == "float32"
    monkeypatch.setenv("TURNCACHE_KV_DTYPE", "float16")
    assert settings().kv_dtype == "float16"
    assert settings("--kv-dtype", "float32").kv_dtype == "float32"


def test_the_tenant_cache_share_flag_reaches_the_prefix_cache(monkeypatch):
    from chat.server.main import build_cache

    monkeypatch.delenv("TURNCACHE_TENANT_CACHE_SHARE", raising=False)
    default = settings("--cache-dir", "")
    assert default.tenant_cache_share is None and build_cache(default).stats().tenant_share is None
    shared = settings("--cache-dir", "", "--tenant-cache-share", "0.25")
    assert build_cache(shared).stats().tenant_share == 0.25
    monkeypatch.setenv("TURNCACHE_TENANT_CACHE_SHARE", "0.5")
    assert build_cache(settings("--cache-dir", "")).stats().tenant_share == 0.5
    assert build_cache(shared.model_copy(update={"prefix_cache": False})) is None


def test_the_yield_flags_reach_the_scheduler(monkeypatch):
    from chat.engine.scheduler import DEFAULT_YIELD_BUDGET, DEFAULT_YIELD_HOLD_S, YIELD_BUDGET_RANGE
    from chat.server.main import batch_settings
    from chat.server.settings import YIELD_BUDGET_LEAST

    assert YIELD_BUDGET_RANGE[0] == YIELD_BUDGET_LEAST
    monkeypatch.delenv("TURNCACHE_YIELD_BUDGET", raising=False)
    default = batch_settings(settings())
    assert (default.yield_budget, default.yield_hold_s) == (DEFAULT_YIELD_BUDGET, DEFAULT_YIELD_HOLD_S)
    given = batch_settings(settings("--yield-budget", "0", "--yield-hold-s", "2"))
    assert (given.yield_budget, given.yield_hold_s) == (0, 2.0)
    monkeypatch.setenv("TURNCACHE_YIELD_BUDGET", "48")
    assert batch_settings(settings()).yield_budget == 48


def test_media_url_flags_reach_the_settings():
    off = settings()
    assert off.media_url_hosts == [] and not off.media_url_allow_private
    args = ["--media-url-host", "Images.Example.com", "--media-url-host", "*.cdn.example.org:8443"]
    args += ["--media-url-max-bytes", "1000", "--media-url-timeout-s", "2.5", "--media-url-allow-private"]
    on = settings(*args)
    assert on.media_url_hosts == ["images.example.com", "*.cdn.example.org:8443"]
    assert (on.media_url_max_bytes, on.media_url_timeout_s, on.media_url_allow_private) == (1000, 2.5, True)


def test_served_model_alias_flags_reach_the_settings():
    assert settings().served_model_aliases == []
    args = ["--served-model-alias", "claude-*", "--served-model-alias", "gpt-4o"]
    assert settings(*args).served_model_aliases == ["claude-*", "gpt-4o"]


def test_the_send_buffer_flag_reaches_the_settings(monkeypatch):
    monkeypatch.delenv("TURNCACHE_SEND_BUFFER_KIB", raising=False)
    assert settings().send_buffer_kib is None  # the kernel's own
    assert settings("--send-buffer-kib", "64").send_buffer_kib == 64


def test_the_volatile_line_flags_and_environment_reach_the_engines_filter(monkeypatch, capsys):
    from chat.engine.volatile_lines import DEFAULT_PATTERNS
    from chat.server.main import volatile_lines

    monkeypatch.delenv("TURNCACHE_VOLATILE_LINES", raising=False)
    monkeypatch.delenv("TURNCACHE_KEEP_VOLATILE_LINES", raising=False)
    default = volatile_lines(settings())
    assert default.patterns == DEFAULT_PATTERNS and default.drop  # on by default
    line = "x-anthropic-billing-header: cc_version=2.1.197.c8e; cc_entrypoint=sdk-cli;\nrest"
    assert default.strip_text(line) == "rest"
    kept = volatile_lines(settings("--keep-volatile-lines"))
    assert kept.patterns == DEFAULT_PATTERNS and not kept.drop
    mine = volatile_lines(settings("--volatile-line", "req-id: [0-9a-f]+"))
    assert mine.patterns == ("req-id: [0-9a-f]+",) and mine.strip_text("req-id: 3f\nhi") == "hi"
    monkeypatch.setenv("TURNCACHE_VOLATILE_LINES", '["trace=\\\\d+"]')
    monkeypatch.setenv("TURNCACHE_KEEP_VOLATILE_LINES", "true")
    from_env = volatile_lines(settings())
    assert from_env.patterns == (r"trace=\d+",) and not from_env.drop
    with pytest.raises(SystemExit, match="--volatile-line"):
        settings("--volatile-line", "(unclosed")


def test_the_chat_template_flag_and_its_environment_variable_reach_the_settings(monkeypatch):
    monkeypatch.delenv("TURNCACHE_CHAT_TEMPLATE", raising=False)
    assert settings().chat_template is None
    assert settings("--chat-template", "t.jinja").chat_template == "t.jinja"
    monkeypatch.setenv("TURNCACHE_CHAT_TEMPLATE", "{{ messages }}")
    assert settings().chat_template == "{{ messages }}"
    assert settings("--chat-template", "t.jinja").chat_template == "t.jinja"


def test_serve_refuses_a_template_that_does_not_compile_before_the_model_loads(monkeypatch, tmp_path):
    import chat.server.main

    def never(settings):
        raise AssertionError("the model was loaded")

    monkeypatch.setattr(chat.server.main, "build_engine", never)
    bad = tmp_path / "bad.jinja"
    bad.write_text("{% for m in messages %}\n{{ m.content }\n{% endfor %}")
    with pytest.raises(SystemExit) as info:
        main(["serve", "--model", "tiny-llama", "--chat-template", str(bad), "--port", "0"])
    assert f"{bad}: line 2: unexpected '}}'" in str(info.value.code)
    with pytest.raises(SystemExit, match="no such file"):
        main(["serve", "--model", "tiny-llama", "--chat-template", str(tmp_path / "missing.jinja"), "--port", "0"])
