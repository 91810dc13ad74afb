"""The chat UI in a real browser against a real server (FakeRuntime): turns, media, stop, edit, errors, sessions.

Each test saves a screenshot under artifacts/web/.
"""

from __future__ import annotations

import io
import re

import pytest
from PIL import Image

from tests.web.conftest import LONG_REPLY, send, until, wait_connected, wait_replies

pytestmark = pytest.mark.browser


def png_bytes(color=(200, 60, 40), size=(48, 32)) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", size, color).save(buf, format="PNG")
    return buf.getvalue()


def replies(page):
    return page.locator("#messages .msg-assistant:not(.streaming)")


def badge_numbers(page, i: int) -> tuple[int, int]:
    badge = replies(page).nth(i).locator(".badge")
    return int(badge.get_attribute("data-cached-tokens")), int(badge.get_attribute("data-prompt-tokens"))


def shot(page, artifacts, name: str) -> None:
    page.screenshot(path=str(artifacts / f"{name}.png"))


def test_two_turns_second_reply_is_served_from_the_cache(page, artifacts):
    send(page, "What is a prefix cache?")
    wait_replies(page, 1)
    send(page, "And why does it help a second turn?")
    wait_replies(page, 2)

    cached, prompt = badge_numbers(page, 1)
    assert 0 < cached < prompt
    text = replies(page).nth(1).locator(".badge").inner_text()
    assert re.fullmatch(
        rf"{cached:,} of {prompt:,} prompt tokens cached · first token \d+\.\d\d s( · [\d.]+ tok/s)?", text
    ), text
    assert badge_numbers(page, 0)[0] == 0  # the first turn had nothing to reuse
    until(page, "document.querySelectorAll('#chart .bar-cached').length === 2")
    page.get_by_text("Hit rate").wait_for()
    shot(page, artifacts, "two_turns_cached")


def test_model_output_is_shown_as_text_never_as_html(page, artifacts):
    send(page, "please inject something")
    wait_replies(page, 1)
    reply = replies(page).nth(0)
    body = reply.locator(".msg-body")
    assert "<img src=x" in body.inner_text()
    assert "<script>" in body.inner_text()
    assert reply.locator("img, script, b, iframe").count() == 0
    assert reply.locator("a").count() == 0  # the javascript: link is not a link
    assert reply.locator(".code-block code").inner_text() == "<script>window.__pwned=4</script>"
    assert page.evaluate("window.__pwned") is None
    shot(page, artifacts, "injection_as_text")


def test_markdown_is_rendered(page, artifacts):
    send(page, "show me markdown")
    wait_replies(page, 1)
    reply = replies(page).nth(0)
    assert reply.locator("strong").inner_text() == "bold"
    assert reply.locator("li").count() == 2
    assert reply.locator(".code-block code.language-python").inner_text() == "def add(a, b):\n    return a + b"
    link = reply.locator("a")
    assert link.get_attribute("href") == "https://example.com/docs"
    assert link.get_attribute("rel") == "noopener noreferrer nofollow"
    shot(page, artifacts, "markdown")


def test_attach_an_image_and_get_a_reply(page, artifacts):
    page.set_input_files("#file-input", files=[{"name": "red.png", "mimeType": "image/png", "buffer": png_bytes()}])
    page.locator("#attachments img").wait_for()
    assert "red.png" in page.locator("#attachments").inner_text()
    send(page, "What colour is this?")
    wait_replies(page, 1)
    user = page.locator("#messages .msg-user").nth(0)
    src = user.locator("img").get_attribute("src")
    assert src.startswith("data:image/png;base64,")
    assert page.locator("#attachments li").count() == 0  # sent attachments leave the composer
    assert page.locator("#notice").is_hidden()
    shot(page, artifacts, "image_turn")


def test_files_can_be_dropped_and_pasted_and_wrong_ones_are_refused(page, artifacts):
    page.evaluate(
        """() => {
          const file = (name, type) => new File([new Uint8Array([0x52, 0x49, 0x46, 0x46, 1, 2, 3, 4])], name, {type});
          const drop = new DataTransfer();
          drop.items.add(file("clip.wav", "audio/wav"));
          const chat = document.getElementById("chat");
          chat.dispatchEvent(new DragEvent("dragenter", {dataTransfer: drop, bubbles: true, cancelable: true}));
          chat.dispatchEvent(new DragEvent("drop", {dataTransfer: drop, bubbles: true, cancelable: true}));
          const paste = new DataTransfer();
          paste.items.add(file("movie.mp4", "video/mp4"));
          document.getElementById("message").dispatchEvent(
            new ClipboardEvent("paste", {clipboardData: paste, bubbles: true, cancelable: true}));
        }"""
    )
    page.locator("#attachments audio").wait_for()
    page.locator("#attachments video").wait_for()
    assert page.locator("#drop-overlay").is_hidden()
    page.set_input_files("#file-input", files=[{"name": "notes.txt", "mimeType": "text/plain", "buffer": b"hi"}])
    notice = page.get_by_role("alert").filter(has_text="notes.txt")
    notice.wait_for()
    assert "You can attach" in notice.inner_text()
    assert page.locator("#attachments li").count() == 2
    shot(page, artifacts, "attachments")


def test_stop_ends_a_streaming_reply(page, web_server, artifacts):
    web_server.runtime.delay_s = 0.02  # per forward: the long reply takes ~10 s
    send(page, "tell me a long story")
    until(page, "(document.querySelector('#messages .streaming .msg-body')?.textContent || '').length > 20")
    stop = page.get_by_role("button", name="Stop generating")
    stop.click()
    wait_replies(page, 1)
    reply = replies(page).nth(0)
    assert "stopped" in reply.locator(".badge").inner_text()
    text = reply.locator(".msg-body").inner_text()
    assert text and len(text) < len(LONG_REPLY.strip())
    assert stop.is_hidden()
    web_server.runtime.delay_s = 0.0
    send(page, "are you still there?")
    wait_replies(page, 2)
    shot(page, artifacts, "stopped")


def test_edit_an_earlier_message_branches_the_conversation(page, artifacts):
    send(page, "first question")
    wait_replies(page, 1)
    send(page, "second question")
    wait_replies(page, 2)
    first_reply_id = replies(page).nth(0).get_attribute("data-id")

    page.locator("#messages .msg-user").nth(0).get_by_role("button", name="Edit this message").click()
    editor = page.get_by_label("Edited message")
    editor.fill("a better first question")
    page.get_by_role("button", name="Send edit").click()
    until(page, "document.querySelectorAll('#messages .msg').length === 2")
    wait_replies(page, 1)

    users = page.locator("#messages .msg-user")
    assert users.count() == 1
    assert users.nth(0).inner_text().startswith("a better first question")
    assert "a better first question" in replies(page).nth(0).inner_text()
    assert replies(page).nth(0).get_attribute("data-id") != first_reply_id
    assert page.evaluate("window.turncache.controller.messages.length") == 2
    shot(page, artifacts, "edited")


def test_regenerate_replaces_the_last_reply(page):
    send(page, "hello")
    wait_replies(page, 1)
    old_id = replies(page).nth(0).get_attribute("data-id")
    page.get_by_role("button", name="Regenerate this reply").click()
    until(page, "document.querySelector('#messages .msg-assistant:not(.streaming)')?.dataset.id !== arg", old_id)
    wait_replies(page, 1)
    assert page.locator("#messages .msg").count() == 2
    assert badge_numbers(page, 0)[0] > 0  # the same prompt again


def attach_and_fail(page, name: str, data: bytes, question: str) -> None:
    """Send `data` as an image with `question`; check that the turn fails visibly and leaves nothing behind."""
    page.set_input_files("#file-input", files=[{"name": name, "mimeType": "image/png", "buffer": data}])
    page.locator("#attachments li").wait_for()
    send(page, question)
    until(page, "!document.getElementById('notice').hidden || document.querySelector('#messages .badge')")
    notice = page.locator("#notice")
    assert notice.is_visible(), "the turn did not fail"
    assert "attachment could not be used" in notice.inner_text()
    until(page, "!window.turncache.controller.generating")
    assert page.locator("#messages .msg").count() == 0  # the failed turn left nothing behind
    assert page.get_by_label("Message", exact=True).input_value() == question  # the draft is back


def test_a_server_error_is_shown_and_the_chat_goes_on(page, web_server, artifacts):
    web_server.runtime.modalities = frozenset()  # the model now refuses images: the turn fails with invalid_media
    try:
        attach_and_fail(page, "red.png", png_bytes(), "describe this")
    finally:
        web_server.runtime.modalities = frozenset({"image", "audio", "video"})
    assert "does not accept image input" in page.locator("#notice").inner_text()
    shot(page, artifacts, "server_error")
    page.get_by_label("Message", exact=True).fill("")
    send(page, "then just say hello")
    wait_replies(page, 1)
    assert page.locator("#notice").is_hidden()


def test_a_corrupt_file_shows_an_error_and_the_chat_goes_on(page, artifacts):
    corrupt = b"\x89PNG\r\n\x1a\n" + b"this is not an image" * 10
    attach_and_fail(page, "broken.png", corrupt, "what is in this picture?")
    shot(page, artifacts, "corrupt_file_error")
    page.get_by_label("Message", exact=True).fill("")
    send(page, "then just say hello")
    wait_replies(page, 1)
    assert page.locator("#notice").is_hidden()


def test_sessions_survive_a_reload_and_can_be_reopened(page, artifacts):
    send(page, "chat one about apples")
    wait_replies(page, 1)
    page.get_by_role("button", name="+ New chat").click()
    until(page, "window.turncache.controller.messages.length === 0 && !window.turncache.controller.loading")
    send(page, "chat two about pears")
    wait_replies(page, 1)

    page.reload()
    wait_connected(page)
    wait_replies(page, 1)
    assert "pears" in page.locator("#messages").inner_text()
    sessions = page.locator("#session-list .session")
    assert sessions.count() == 2
    assert "chat two about pears" in sessions.nth(0).inner_text()

    page.locator("#session-list .session", has_text="apples").click()
    until(page, "document.querySelector('#messages')?.innerText.includes('apples')")
    wait_replies(page, 1)
    assert page.locator("#session-list .session[aria-current='true']").inner_text().startswith("chat one")
    # the badge survived the reload: figures are kept per message in localStorage
    assert replies(page).nth(0).locator(".badge").count() == 1
    send(page, "more about apples")
    wait_replies(page, 2)
    assert badge_numbers(page, 1)[0] > 0
    shot(page, artifacts, "sessions")


def test_a_dropped_connection_reconnects_and_resumes(page):
    send(page, "before the drop")
    wait_replies(page, 1)
    session_id = page.evaluate("window.turncache.controller.session.id")
    page.evaluate("window.turncache.connection.drop()")
    until(page, "window.turncache.connection.state !== 'open'")
    page.get_by_role("status").filter(has_text="Connected").wait_for()
    wait_connected(page)
    assert page.evaluate("window.turncache.controller.session.id") == session_id
    send(page, "after the drop")
    wait_replies(page, 2)
    assert badge_numbers(page, 1)[0] > 0


def test_settings_are_sent_to_the_session(page):
    temperature = page.get_by_label("Temperature")
    temperature.fill("0.5")
    temperature.blur()
    seed = page.get_by_label("Seed")
    seed.fill("7")
    seed.blur()
    until(
        page,
        "window.turncache.controller.session.sampling.temperature === 0.5 "
        "&& window.turncache.controller.session.sampling.seed === 7",
    )
    top_p = page.get_by_label("Top p")
    top_p.fill("3")
    top_p.blur()
    assert top_p.get_attribute("aria-invalid") == "true"
    assert "Top p must be" in page.locator("#settings-error").inner_text()
    # a new chat starts with the settings shown
    page.get_by_role("button", name="+ New chat").click()
    until(page, "window.turncache.controller.session && !window.turncache.controller.loading")
    assert page.evaluate("window.turncache.controller.session.sampling.seed") == 7


def test_phone_width(page, artifacts):
    page.set_viewport_size({"width": 390, "height": 844})
    send(page, "hello from a phone, show markdown")
    wait_replies(page, 1)
    # the chats drawer slides off-screen (a short transition after the resize)
    until(page, "document.getElementById('sidebar').getBoundingClientRect().right <= 0")
    width = page.evaluate("document.documentElement.scrollWidth")
    assert width <= 390  # nothing overflows sideways
    shot(page, artifacts, "phone")
    page.get_by_role("button", name="Chats and settings").click()
    until(page, "document.getElementById('sidebar').getBoundingClientRect().x >= 0")
    page.wait_for_timeout(250)  # the drawer's slide-in
    shot(page, artifacts, "phone_drawer")
    page.keyboard.press("Escape")
    page.get_by_role("button", name="Cache panel").click()
    until(page, "document.getElementById('cache-panel').getBoundingClientRect().right <= 391")


def test_shift_enter_adds_a_line_and_enter_sends(page):
    box = page.get_by_label("Message", exact=True)
    box.fill("line one")
    box.press("Shift+Enter")
    box.type("line two")
    assert box.input_value() == "line one\nline two"
    assert page.locator("#messages .msg").count() == 0
    box.press("Enter")
    wait_replies(page, 1)
    assert page.locator("#messages .msg-user").nth(0).locator(".msg-body").inner_text() == "line one\nline two"


def test_a_chat_the_server_forgot_is_replaced_by_a_new_one(page):
    page.evaluate(
        "localStorage.setItem('turncache.current', 'sess_gone');"
        "localStorage.setItem('turncache.sessions', JSON.stringify([{id: 'sess_gone', title: 'old', updated: 0}]))"
    )
    page.reload()
    page.get_by_role("alert").filter(has_text="no longer on the server").wait_for()
    wait_connected(page)
    assert page.evaluate("window.turncache.controller.session.id") != "sess_gone"
    assert page.locator("#session-list .session").count() == 0
    send(page, "hello again")
    wait_replies(page, 1)


def test_every_control_has_an_accessible_name(page):
    send(page, "show markdown")
    wait_replies(page, 1)
    page.locator("#messages .msg-user").nth(0).get_by_role("button", name="Edit this message").click()
    unnamed = page.evaluate(
        """() => [...document.querySelectorAll('button, input, select, textarea')].filter(el => {
             const label = el.getAttribute('aria-label') || (el.labels && [...el.labels].map(l => l.textContent)
               .join('')) || (el.tagName === 'BUTTON' ? el.textContent : '');
             return !label.trim();
           }).map(el => el.outerHTML.slice(0, 120))"""
    )
    assert unnamed == []


def test_a_drop_during_a_reply_keeps_what_the_server_kept(page, web_server):
    web_server.runtime.delay_s = 0.02
    send(page, "tell me a long story")
    until(page, "(document.querySelector('#messages .streaming .msg-body')?.textContent || '').length > 20")
    page.evaluate("window.turncache.connection.drop()")
    page.get_by_role("alert").filter(has_text="connection dropped").wait_for()
    web_server.runtime.delay_s = 0.0
    # the server cancels the turn and keeps its partial text; the page shows it once resumed
    until(
        page,
        "document.querySelectorAll('#messages .msg-assistant').length === 1 && !window.turncache.controller.loading",
    )
    reply = page.locator("#messages .msg-assistant")
    assert reply.locator(".badge").inner_text() == "stopped"
    assert reply.locator(".msg-body").inner_text().startswith("Once upon a time")
    send(page, "and then?")
    wait_replies(page, 2)


def test_a_server_with_an_access_token(browser):
    from cache import PrefixCache
    from chat.engine.engine import Engine
    from chat.server.app import create_app
    from chat.server.runner import BackgroundServer
    from chat.server.settings import ServerSettings
    from tests.chat.engine.fakes import FakeRuntime

    engine = Engine(FakeRuntime(), cache=PrefixCache())
    server = BackgroundServer(create_app(engine, ServerSettings(auth_token="s3cret"), model_name="fake"))
    page = browser.new_page()
    try:
        with server:
            page.goto(server.url + "/")
            page.get_by_role("status").filter(has_text="needs an access token").wait_for()
            token = page.get_by_label("Access token")
            token.fill("s3cret")
            token.press("Tab")
            wait_connected(page)
            send(page, "hello with a token")
            wait_replies(page, 1)
            page.locator("#cache-figures", has_text="Entries").wait_for()
    finally:
        page.close()
        engine.close()


def test_two_tenants_in_one_browser_never_see_each_others_chats(browser, tmp_path):
    """The web UI resumes sessions over the WebSocket: another token's session is answered as missing, the page then
    starts a new chat, and switching back shows the first tenant its own chat again."""
    from cache import PrefixCache
    from chat.engine.engine import Engine
    from chat.server.app import create_app
    from chat.server.runner import BackgroundServer
    from chat.server.settings import ServerSettings
    from tests.chat.engine.fakes import FakeRuntime

    alice, bob = "alice-key-0123456789abcdef", "bob-key-fedcba9876543210xyz"
    keys = tmp_path / "keys"
    keys.write_text(f"{alice} alice\n{bob} bob\n")
    engine = Engine(FakeRuntime(), cache=PrefixCache())
    server = BackgroundServer(create_app(engine, ServerSettings(api_keys_file=str(keys)), model_name="fake"))
    page = browser.new_page()

    def use_token(value: str) -> None:
        token = page.get_by_label("Access token")
        token.fill(value)
        token.press("Tab")
        wait_connected(page)

    try:
        with server:
            page.goto(server.url + "/")
            page.get_by_role("status").filter(has_text="needs an access token").wait_for()
            use_token(alice)
            send(page, "alice's private question")
            wait_replies(page, 1)
            alice_session = page.evaluate("window.turncache.controller.session.id")
            use_token(bob)
            until(page, "window.turncache.controller.session.id !== arg", alice_session)
            assert page.locator("#messages .msg").count() == 0
            assert page.locator("#session-list .session").count() == 0  # alice's chat is not listed for bob
            page.evaluate("(id) => window.turncache.controller.open(id)", alice_session)  # bob tries her id
            page.get_by_role("alert").filter(has_text="no longer on the server").wait_for()
            wait_connected(page)
            assert page.evaluate("window.turncache.controller.session.id") != alice_session
            assert "alice's private question" not in page.locator("#messages").inner_text()
            use_token(alice)
            until(page, "window.turncache.controller.session.id === arg", alice_session)
            wait_replies(page, 1)
            assert "alice's private question" in page.locator("#messages").inner_text()
            assert page.locator("#session-list .session").count() == 1
    finally:
        page.close()
        engine.close()
