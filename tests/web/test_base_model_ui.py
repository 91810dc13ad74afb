"""A base model (tiny-base: no chat template) in the chat UI, in a real browser: the page says the model does not chat
and why (its notice names --chat-template), the message box and Send are disabled, and nothing is sent; the same
page on a chat model shows no such notice."""

from __future__ import annotations

import pytest

from tests.web.conftest import until, wait_connected

pytestmark = pytest.mark.browser


@pytest.fixture(scope="module")
def base_server():
    from cache import PrefixCache
    from chat.engine.engine import Engine
    from chat.models import load_model
    from chat.server.app import create_app
    from chat.server.runner import BackgroundServer
    from chat.server.settings import ServerSettings

    runtime = load_model("tiny-base")
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
    page.on("response", lambda r: problems.append(f"HTTP {r.status}: {r.url}") if r.status >= 400 else None)
    sent: list[str] = []
    page.on("websocket", lambda ws: ws.on("framesent", lambda frame: sent.append(str(frame))))
    page.add_init_script("localStorage.clear()")
    page.goto(url + "/")
    wait_connected(page)
    return page, problems, sent


def test_a_base_model_is_shown_as_one_and_the_composer_is_closed(browser, base_server, artifacts):
    page, problems, sent = _page(browser, base_server.url)
    try:
        notice = page.locator("#no-chat")
        notice.wait_for(state="visible")
        text = notice.inner_text()
        assert "tiny-base is a base model" in text and "--chat-template" in text and "/v1/completions" in text
        box = page.get_by_label("Message", exact=True)
        assert box.is_disabled() and page.locator("#send").is_disabled()
        assert "does not chat" in box.get_attribute("placeholder")
        until(page, "!window.turncache.controller.loading")
        page.evaluate(  # typed in by a script and submitted all the same: nothing is sent
            "document.getElementById('message').value = 'hello'; document.getElementById('composer').requestSubmit()"
        )
        page.wait_for_timeout(300)
        assert not any("turn.create" in frame for frame in sent), sent
        assert page.locator("#messages .msg-user").count() == 0
        page.screenshot(path=str(artifacts / "base_model.png"))
    finally:
        page.close()
    assert not problems, problems


def test_a_chat_model_shows_no_such_notice(page):
    assert page.locator("#no-chat").is_hidden()
    assert page.get_by_label("Message", exact=True).is_enabled()
