"""`turncache chat` (chat/cli/chat.py): what it refuses before the terminal loop starts."""

import json

import pytest

from chat.cli import main
from chat.cli.chat import tools_file


def test_chat_with_a_base_model_needs_a_template(monkeypatch):
    monkeypatch.delenv("TURNCACHE_CHAT_TEMPLATE", raising=False)
    with pytest.raises(SystemExit, match=r"tiny-base has no chat template .* --chat-template"):
        main(["chat", "--model", "tiny-base"])
    with pytest.raises(SystemExit, match="line 1"):
        main(["chat", "--model", "tiny-base", "--chat-template", "{% if %}"])


def test_chat_refuses_sampling_settings_out_of_the_wires_range_naming_the_flag():
    with pytest.raises(SystemExit, match=r"^turncache: --temperature: "):
        main(["chat", "--model", "tiny-llama", "--temperature", "-1"])
    with pytest.raises(SystemExit, match=r"^turncache: --max-tokens: "):
        main(["chat", "--model", "tiny-llama", "--max-tokens", "0"])


def test_the_tools_file_is_a_json_list_of_function_definitions(tmp_path):
    tools = [{"type": "function", "function": {"name": "now", "parameters": {"type": "object"}}}]
    given = tmp_path / "tools.json"
    given.write_text(json.dumps(tools))
    assert tools_file(str(given)) == tools
    given.write_text(json.dumps({"name": "now"}))
    with pytest.raises(SystemExit, match=r"tools.json: must hold a JSON list of function definitions"):
        tools_file(str(given))
    given.write_text("[")
    with pytest.raises(SystemExit, match=r"^turncache: --tools .*tools.json: "):
        tools_file(str(given))
    with pytest.raises(SystemExit, match=r"^turncache: --tools .*missing.json: "):
        tools_file(str(tmp_path / "missing.json"))
