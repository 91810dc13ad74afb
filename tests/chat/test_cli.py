import json

import pytest

from chat.cli import main


def test_eval_needs_a_dataset(capsys):
    with pytest.raises(SystemExit) as usage:
        main(["eval"])
    assert usage.value.code == 2 and "DATASET.jsonl" in capsys.readouterr().err


def test_eval_refuses_unusable_arguments_with_status_2(tmp_path, capsys):
    assert main(["eval", str(tmp_path / "missing.jsonl")]) == 2
    assert "does not exist" in capsys.readouterr().err
    dataset = tmp_path / "d.jsonl"
    dataset.write_text(json.dumps({"id": "a", "messages": [{"role": "user", "content": "hi"}]}) + "\n")
    assert main(["eval", str(dataset), "--url", "http://127.0.0.1:1/"]) == 2
    assert main(["eval", str(dataset), "--concurrency", "0"]) == 2


def test_eval_against_a_server_that_is_down_completes_with_errors(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    dataset = tmp_path / "d.jsonl"
    dataset.write_text(json.dumps({"id": "a", "messages": [{"role": "user", "content": "hi"}]}) + "\n")
    assert main(["eval", str(dataset), "--url", "ws://127.0.0.1:1/v1/ws", "--no-progress", "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["errors"] == 1 and summary["error_codes"] == {"connect_failed": 1}
    assert (tmp_path / "d.stateful.results.jsonl").is_file()  # the default --out


def test_bench_cache_prints_one_json_object_with_the_issue_keys(capsys):
    assert main(["bench", "cache", "--json", "--entries", "200"]) == 0
    result = json.loads(capsys.readouterr().out)
    for key in (
        "lookup_p99_ms",
        "linear_p99_ms",
        "lookup_speedup",
        "materialize_ms_4k",
        "conversation_bytes_ratio",
        "disk_write_ms_4k",
        "disk_read_ms_4k",
    ):
        assert isinstance(result[key], float) and result[key] > 0
    assert result["entries"] == 200
    assert result["linear_agreement"] == 1.0  # index and linear scan found the same prefix lengths
    assert result["conversation_bytes_ratio"] == pytest.approx(1.0)


def test_bench_cache_table_without_json(capsys):
    assert main(["bench", "cache", "--entries", "50"]) == 0
    out = capsys.readouterr().out
    assert "lookup_p99_ms" in out and not out.lstrip().startswith("{")


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
    from chat.cli import _settings, build_parser

    monkeypatch.setenv("TURNCACHE_HOME", str(tmp_path))
    monkeypatch.delenv("TURNCACHE_CACHE_DIR", raising=False)
    default = _settings(build_parser().parse_args(["serve"]))
    assert default.cache_dir == str(tmp_path / "prefix-cache") and default.disk_budget == 8 * 2**30
    off = _settings(build_parser().parse_args(["serve", "--cache-dir", "", "--disk-budget", "0"]))
    assert off.cache_dir == "" and off.disk_budget == 0
    with pytest.raises(SystemExit, match="--disk-budget"):
        _settings(build_parser().parse_args(["serve", "--disk-budget", "-1"]))


def test_the_kv_dtype_flag_and_its_environment_variable_reach_the_settings(monkeypatch):
    from chat.cli import _settings, build_parser

    monkeypatch.delenv("TURNCACHE_KV_DTYPE", raising=False)
    assert _settings(build_parser().parse_args(["serve"])).kv_dtype is None  # the model's default
    assert _settings(build_parser().parse_args(["serve", "--kv-dtype", "float32"])).kv_dtype == "float32"
    monkeypatch.setenv("TURNCACHE_KV_DTYPE", "float16")
    assert _settings(build_parser().parse_args(["serve"])).kv_dtype == "float16"
    assert _settings(build_parser().parse_args(["serve", "--kv-dtype", "float32"])).kv_dtype == "float32"


def test_the_tenant_cache_share_flag_reaches_the_prefix_cache(monkeypatch):
    from chat.cli import _settings, build_parser
    from chat.server.main import build_cache

    monkeypatch.delenv("TURNCACHE_TENANT_CACHE_SHARE", raising=False)
    default = _settings(build_parser().parse_args(["serve", "--cache-dir", ""]))
    assert default.tenant_cache_share is None and build_cache(default).stats().tenant_share is None
    shared = _settings(build_parser().parse_args(["serve", "--cache-dir", "", "--tenant-cache-share", "0.25"]))
    assert build_cache(shared).stats().tenant_share == 0.25
    monkeypatch.setenv("TURNCACHE_TENANT_CACHE_SHARE", "0.5")
    assert build_cache(_settings(build_parser().parse_args(["serve", "--cache-dir", ""]))).stats().tenant_share == 0.5
    assert build_cache(shared.model_copy(update={"prefix_cache": False})) is None


def test_the_yield_flags_reach_the_scheduler(monkeypatch):
    from chat.cli import _settings, build_parser
    from chat.engine.scheduler import DEFAULT_YIELD_BUDGET, DEFAULT_YIELD_HOLD_S, YIELD_BUDGET_RANGE
    from chat.server.main import batch_settings
    from chat.server.settings import YIELD_BUDGET_LEAST

    assert YIELD_BUDGET_RANGE[0] == YIELD_BUDGET_LEAST
    monkeypatch.delenv("TURNCACHE_YIELD_BUDGET", raising=False)
    default = batch_settings(_settings(build_parser().parse_args(["serve"])))
    assert (default.yield_budget, default.yield_hold_s) == (DEFAULT_YIELD_BUDGET, DEFAULT_YIELD_HOLD_S)
    given = batch_settings(
        _settings(build_parser().parse_args(["serve", "--yield-budget", "0", "--yield-hold-s", "2"]))
    )
    assert (given.yield_budget, given.yield_hold_s) == (0, 2.0)
    monkeypatch.setenv("TURNCACHE_YIELD_BUDGET", "48")
    assert batch_settings(_settings(build_parser().parse_args(["serve"]))).yield_budget == 48


def test_media_url_flags_reach_the_settings():
    from chat.cli import _settings, build_parser

    off = _settings(build_parser().parse_args(["serve"]))
    assert off.media_url_hosts == [] and not off.media_url_allow_private
    args = ["serve", "--media-url-host", "Images.Example.com", "--media-url-host", "*.cdn.example.org:8443"]
    args += ["--media-url-max-bytes", "1000", "--media-url-timeout-s", "2.5", "--media-url-allow-private"]
    on = _settings(build_parser().parse_args(args))
    assert on.media_url_hosts == ["images.example.com", "*.cdn.example.org:8443"]
    assert (on.media_url_max_bytes, on.media_url_timeout_s, on.media_url_allow_private) == (1000, 2.5, True)


def test_served_model_alias_flags_reach_the_settings():
    from chat.cli import _settings, build_parser

    assert _settings(build_parser().parse_args(["serve"])).served_model_aliases == []
    args = ["serve", "--served-model-alias", "claude-*", "--served-model-alias", "gpt-4o"]
    assert _settings(build_parser().parse_args(args)).served_model_aliases == ["claude-*", "gpt-4o"]


def test_the_send_buffer_flag_reaches_the_settings(monkeypatch):
    from chat.cli import _settings, build_parser

    monkeypatch.delenv("TURNCACHE_SEND_BUFFER_KIB", raising=False)
    assert _settings(build_parser().parse_args(["serve"])).send_buffer_kib is None  # the kernel's own
    assert _settings(build_parser().parse_args(["serve", "--send-buffer-kib", "64"])).send_buffer_kib == 64


@pytest.mark.parametrize(
    "flags,named",
    [
        (["--rounds", "0"], "--rounds"),
        (["--bad-level", "x"], "--bad-level"),
        (["--bad-pause-s", "nan"], "--bad-pause-s"),
    ],
)
def test_bench_http_refuses_bad_settings_naming_the_flag(flags, named, capsys):
    with pytest.raises(SystemExit) as refused:
        main(["bench", "http", "--json", *flags])
    assert refused.value.code == 2 and named in capsys.readouterr().err


def test_bench_http_runs_its_clients_apart_unless_told_to_keep_them_in_process(monkeypatch):
    got = []
    monkeypatch.setattr("chat.tools.bench.http_bench.main", lambda **kwargs: got.append(kwargs) or 0)
    assert main(["bench", "http", "--json"]) == 0 and main(["bench", "http", "--json", "--clients-in-process"]) == 0
    from chat.tools.bench.http_bench import DEFAULT_ROUNDS

    assert [g["clients_apart"] for g in got] == [True, False] and got[0]["rounds"] == DEFAULT_ROUNDS == 8


def test_the_volatile_line_flags_and_environment_reach_the_engines_filter(monkeypatch, capsys):
    from chat.cli import _settings, build_parser
    from chat.engine.volatile_lines import DEFAULT_PATTERNS
    from chat.server.main import volatile_lines

    monkeypatch.delenv("TURNCACHE_VOLATILE_LINES", raising=False)
    monkeypatch.delenv("TURNCACHE_KEEP_VOLATILE_LINES", raising=False)
    default = volatile_lines(_settings(build_parser().parse_args(["serve"])))
    assert default.patterns == DEFAULT_PATTERNS and default.drop  # on by default
    line = "x-anthropic-billing-header: cc_version=2.1.197.c8e; cc_entrypoint=sdk-cli;\nrest"
    assert default.strip_text(line) == "rest"
    kept = volatile_lines(_settings(build_parser().parse_args(["serve", "--keep-volatile-lines"])))
    assert kept.patterns == DEFAULT_PATTERNS and not kept.drop
    mine = volatile_lines(_settings(build_parser().parse_args(["serve", "--volatile-line", "req-id: [0-9a-f]+"])))
    assert mine.patterns == ("req-id: [0-9a-f]+",) and mine.strip_text("req-id: 3f\nhi") == "hi"
    monkeypatch.setenv("TURNCACHE_VOLATILE_LINES", '["trace=\\\\d+"]')
    monkeypatch.setenv("TURNCACHE_KEEP_VOLATILE_LINES", "true")
    from_env = volatile_lines(_settings(build_parser().parse_args(["serve"])))
    assert from_env.patterns == (r"trace=\d+",) and not from_env.drop
    with pytest.raises(SystemExit, match="--volatile-line"):
        _settings(build_parser().parse_args(["serve", "--volatile-line", "(unclosed"]))


def test_the_chat_template_flag_and_its_environment_variable_reach_the_settings(monkeypatch):
    from chat.cli import _settings, build_parser

    monkeypatch.delenv("TURNCACHE_CHAT_TEMPLATE", raising=False)
    assert _settings(build_parser().parse_args(["serve"])).chat_template is None
    assert _settings(build_parser().parse_args(["serve", "--chat-template", "t.jinja"])).chat_template == "t.jinja"
    monkeypatch.setenv("TURNCACHE_CHAT_TEMPLATE", "{{ messages }}")
    assert _settings(build_parser().parse_args(["serve"])).chat_template == "{{ messages }}"
    assert _settings(build_parser().parse_args(["serve", "--chat-template", "t.jinja"])).chat_template == "t.jinja"


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


def test_chat_with_a_base_model_needs_a_template(monkeypatch):
    monkeypatch.delenv("TURNCACHE_CHAT_TEMPLATE", raising=False)
    with pytest.raises(SystemExit, match=r"tiny-base has no chat template .* --chat-template"):
        main(["chat", "--model", "tiny-base"])
    with pytest.raises(SystemExit, match="line 1"):
        main(["chat", "--model", "tiny-base", "--chat-template", "{% if %}"])
