"""Tool calls in the chat UI, in a real browser: a tiny tool-calling model (tiny-hermes, random weights; the grammar
of a required call keeps it valid) calls the function the settings offer, the page shows the call as a card, the
result typed into the card's form goes back over the WebSocket (tool.results) and the answer follows it, served
from the cache for the whole history but the result; a thinking reply's thinking stays folded apart."""

from __future__ import annotations

import json

import pytest

from tests.web.conftest import TIMEOUT_MS, send, until, wait_connected, wait_replies

pytestmark = pytest.mark.browser

TOOL = {
    "type": "function",
    "function": {
        "name": "get_time",
        "description": "The time in a zone",
        "parameters": {
            "type": "object",
            "properties": {"zone": {"enum": ["UTC", "CET"]}},
            "required": ["zone"],
            "additionalProperties": False,
        },
    },
}


@pytest.fixture(scope="module")
def hermes_server():
    from cache import PrefixCache
    from chat.engine.engine import Engine
    from chat.models import load_model
    from chat.server.app import create_app
    from chat.server.runner import BackgroundServer
    from chat.server.settings import ServerSettings

    runtime = load_model("tiny-hermes")
    engine = Engine(runtime, cache=PrefixCache())
    server = BackgroundServer(create_app(engine, ServerSettings(), model_name=runtime.name))
    with server:
        yield server
    engine.close()


def _page(browser, url: str):
    page = browser.new_page()
    page.set_viewport_size({"width": 1280, "height": 860})
    problems: list[str] = []
    page.on("pageerror", lambda exc: problems.append(f"page error: {exc}"))
    page.on("console", lambda msg: problems.append(f"console: {msg.text}") if msg.type == "error" else None)
    page.add_init_script("localStorage.clear()")
    page.goto(url + "/")
    wait_connected(page)
    return page, problems


def test_a_tool_call_is_a_card_and_its_result_goes_back(browser, hermes_server, artifacts):
    page, problems = _page(browser, hermes_server.url)
    try:
        page.locator(".tool-settings summary").click()
        page.get_by_label("Functions (JSON)").fill(json.dumps([TOOL]))
        page.get_by_label("Tool choice").select_option("required")
        max_tokens = page.get_by_label("Max tokens")
        max_tokens.fill("400")
        max_tokens.blur()
        until(page, "window.turncache.controller.session.sampling.max_tokens === 400")
        send(page, "What time is it in Oslo?")
        card = page.locator("#messages .msg-assistant .tool-call").first
        card.wait_for(timeout=6 * TIMEOUT_MS)
        assert card.locator(".tool-name").inner_text() == "get_time"
        assert json.loads(card.locator(".tool-args").inner_text())["zone"] in ("UTC", "CET")
        assert "<tool_call>" not in page.locator("#messages").inner_text()  # the call's syntax is not shown as text
        page.screenshot(path=str(artifacts / "tool_call_card.png"))

        page.get_by_label("Tool choice").select_option("none")  # the answer after the result is text
        page.get_by_label("Result of get_time").fill('{"time": "12:00"}')
        page.get_by_role("button", name="Send results").click()
        page.locator("#messages .msg-tool .tool-output").wait_for(timeout=6 * TIMEOUT_MS)
        wait_replies(page, 2)
        assert json.loads(page.locator("#messages .msg-tool .tool-output").inner_text()) == {"time": "12:00"}
        badge = page.locator("#messages .msg-assistant").nth(1).locator(".badge")
        assert int(badge.get_attribute("data-cached-tokens")) > 0
        assert page.locator("form.tool-results").count() == 0  # answered: no form any more
        page.screenshot(path=str(artifacts / "tool_result.png"))
    finally:
        page.close()
    assert not problems, problems


def test_a_thinking_reply_is_folded_apart_from_its_answer(page, web_server, artifacts):
    script = web_server.runtime.script
    web_server.runtime.script = lambda prompt: "<think>Two and two make four.</think>It is **4**."
    try:
        send(page, "what is 2+2?")
        wait_replies(page, 1)
    finally:
        web_server.runtime.script = script
    reply = page.locator("#messages .msg-assistant").nth(0)
    box = reply.locator("details.reasoning")
    assert box.get_attribute("open") is None  # folded once the reply is done
    assert box.locator("summary").inner_text() == "Thought"
    assert reply.locator("strong").inner_text() == "4"
    assert "Two and two" not in reply.locator(".msg-body > :not(details)").all_inner_texts()[0]
    box.locator("summary").click()
    assert box.locator(".plain").inner_text() == "Two and two make four."
    page.screenshot(path=str(artifacts / "reasoning_folded.png"))


def test_tool_settings_are_checked_and_cards_show_text_never_markup(page):
    out = page.evaluate(
        "async () => { const t = await import('/js/tools.js');"
        " const card = t.toolCallCard({id: 'call_1', type: 'function',"
        "   function: {name: 'f', arguments: '{\"q\": \"<img src=x onerror=alert(1)>\"}'}});"
        " const result = t.toolResultCard({role: 'tool', content: '<script>window.__pwned=1</script>'});"
        " return { empty: t.parseTools('  '), bad: t.parseTools('{'), notList: t.parseTools('{}'),"
        '   noName: t.parseTools(\'[{"type": "function", "function": {}}]\'),'
        '   ok: t.parseTools(\'[{"type": "function", "function": {"name": "f"}}]\'),'
        "   cardImgs: card.querySelectorAll('img').length, args: card.querySelector('.tool-args').textContent,"
        "   resultScripts: result.querySelectorAll('script').length }; }"
    )
    assert out["empty"] == {"tools": None}
    assert out["bad"]["error"].startswith("Tools must be JSON")
    assert out["notList"]["error"] == "Tools must be a JSON list of function definitions."
    assert "Tool 1 must be" in out["noName"]["error"]
    assert out["ok"]["tools"][0]["function"]["name"] == "f"
    assert out["cardImgs"] == 0 and json.loads(out["args"]) == {"q": "<img src=x onerror=alert(1)>"}
    assert out["resultScripts"] == 0
    page.locator(".tool-settings summary").click()
    page.get_by_label("Functions (JSON)").fill("[not json")
    send(page, "hello")
    assert "Tools must be JSON" in page.locator("#notice-text").inner_text()
    assert not page.evaluate("window.turncache.controller.generating")
    page.get_by_label("Functions (JSON)").fill(json.dumps([TOOL]))
    page.get_by_label("Functions (JSON)").blur()
    page.get_by_label("Tool choice").select_option("required")
    page.reload()
    wait_connected(page)
    assert json.loads(page.locator("#tools").input_value()) == [TOOL]  # kept in this browser, like the settings
    assert page.locator("#tool_choice").input_value() == "required"
