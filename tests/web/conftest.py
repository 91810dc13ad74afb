"""Browser tests of the web UI: Debian's Chromium, driven by Playwright, against a real server on loopback.

The server runs the weightless FakeMediaRuntime (media decoded, no encoder); its replies are picked by the last user
message (see ``web_script``), so a test chooses a long slow reply, Markdown, or an injection attempt by what it
types. Every test gets a fresh browser context (empty localStorage) and fails if the page logged a script error or
opened a dialog.

Chromium: ``/usr/bin/chromium``; when it is missing the session fixture installs the Debian package (we run as root)
and skips the browser tests only if that install fails. Playwright itself is a dev dependency (``pip install
playwright``; its own browser download is never used).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

from cache import PrefixCache
from chat.engine.engine import Engine
from chat.server.app import create_app
from chat.server.runner import BackgroundServer
from chat.server.settings import ServerSettings
from tests.chat.engine.fakes import END, USER, FakeMediaRuntime, FakeRuntime

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
ARTIFACTS = Path(__file__).resolve().parents[2] / "artifacts" / "web"
TIMEOUT_MS = 10_000  # Playwright's default wait for any element or state

LONG_REPLY = "Once upon a time there was a prefix cache. " * 12  # ~500 tokens: seconds with a per-step delay
MARKDOWN_REPLY = (
    "Here is **bold**, *italic* and `inline code`.\n\n"
    "- one\n- two\n\n"
    "```python\ndef add(a, b):\n    return a + b\n```\n"
    "See [the docs](https://example.com/docs)."
)
INJECTION_REPLY = (
    '<img src=x onerror="window.__pwned=1"> <script>window.__pwned=2</script> '
    "[click](javascript:window.__pwned=3) <b>not bold</b>\n\n"
    "```html\n<script>window.__pwned=4</script>\n```"
)


def last_user_text(prompt: Sequence[int]) -> str:
    start = max((i for i, t in enumerate(prompt) if t == USER), default=-1) + 1
    end = next((i for i in range(start, len(prompt)) if prompt[i] == END), len(prompt))
    return bytes(t for t in prompt[start:end] if t < 256).decode("utf-8", "replace")


def web_script(prompt: Sequence[int]) -> str:
    """The fake model's reply: chosen by keywords in the last user message."""
    text = last_user_text(prompt)
    if "long story" in text:
        return LONG_REPLY
    if "markdown" in text:
        return MARKDOWN_REPLY
    if "inject" in text:
        return INJECTION_REPLY
    return f"You said: {text.strip()[:60]} (reply {sum(prompt) % 997})"


@dataclass
class WebServer:
    url: str  # http://127.0.0.1:PORT
    runtime: FakeRuntime  # set .delay_s to slow replies down
    engine: Engine


def chromium_unavailable() -> str | None:
    """None when /usr/bin/chromium exists (installing the Debian package if needed), else why not."""
    if CHROMIUM.exists():
        return None
    if shutil.which("apt-get") is None:
        return "/usr/bin/chromium is missing and apt-get is not available to install it"
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for cmd in (["apt-get", "update"], ["apt-get", "install", "-y", "chromium"]):
        try:
            done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900, check=False)
        except (OSError, subprocess.TimeoutExpired) as exc:
            return f"{' '.join(cmd)} failed: {exc}"
        if done.returncode != 0:
            return f"{' '.join(cmd)} exited with {done.returncode}: {done.stderr.strip()[-500:]}"
    return None if CHROMIUM.exists() else "apt-get install chromium did not provide /usr/bin/chromium"


@pytest.fixture(scope="session")
def chromium_path() -> str:
    reason = chromium_unavailable()
    if reason is not None:
        pytest.skip(f"no Chromium for the browser tests: {reason}")
    return str(CHROMIUM)


@pytest.fixture(scope="module")
def browser(chromium_path: str) -> Iterator:
    """Chromium for one test module. Playwright's sync API keeps an event loop marked running in this thread while
    it is started, so it must stop before any later module calls ``asyncio.run`` in the same process (which happens
    when tests are spread over workers with pytest-xdist)."""
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:  # a dev dependency: fail loudly rather than skip
        pytest.fail("the browser tests need Playwright: pip install playwright (its browser download is not needed)")
    with tempfile.TemporaryDirectory(prefix="turncache-chromium-") as profile, sync_playwright() as pw:
        # A persistent context is the only way to hand Chromium our own fresh user-data-dir; each test then opens
        # its own page and clears storage (see `page`).
        context = pw.chromium.launch_persistent_context(
            profile, executable_path=chromium_path, args=CHROMIUM_ARGS, headless=True, viewport=None
        )
        context.set_default_timeout(TIMEOUT_MS)
        yield context
        context.close()


@pytest.fixture(scope="session")
def web_server() -> Iterator[WebServer]:
    runtime = FakeMediaRuntime(script=web_script)  # decodes media (a corrupt file fails its turn), no encoder
    engine = Engine(runtime, cache=PrefixCache())
    server = BackgroundServer(create_app(engine, ServerSettings(), model_name="fake"))
    with server:
        yield WebServer(server.url, runtime, engine)
    engine.close()


@pytest.fixture(scope="session")
def artifacts() -> Path:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    return ARTIFACTS


@pytest.fixture
def page(browser, web_server: WebServer) -> Iterator:
    """A fresh page on the chat UI, connected, with empty storage. Fails the test on script errors or dialogs."""
    web_server.runtime.delay_s = 0.0
    page = browser.new_page()
    page.set_viewport_size({"width": 1280, "height": 860})
    problems: list[str] = []
    page.on("pageerror", lambda exc: problems.append(f"page error: {exc}"))
    page.on("console", lambda msg: problems.append(f"console: {msg.text}") if msg.type == "error" else None)
    page.on("response", lambda r: problems.append(f"HTTP {r.status}: {r.url}") if r.status >= 400 else None)

    def on_dialog(dialog) -> None:
        problems.append(f"dialog: {dialog.message}")
        dialog.dismiss()

    page.on("dialog", on_dialog)
    # Forget what earlier tests stored, once per page (sessionStorage survives this page's reloads, so a test can
    # check what survives one).
    page.add_init_script(
        "if (!sessionStorage.getItem('test.fresh')) {"
        " localStorage.clear(); sessionStorage.setItem('test.fresh', '1'); }"
    )
    page.goto(web_server.url + "/")
    wait_connected(page)
    yield page
    page.close()
    web_server.runtime.delay_s = 0.0
    assert not problems, problems


# ---------------------------------------------------------------- helpers for the tests


def until(page, expression: str, arg=None) -> None:
    """Wait until the JavaScript `expression` (which may use `arg`) is truthy.

    Wrapped in a function: Playwright would `eval` a bare expression, which the page's CSP forbids.
    """
    page.wait_for_function(f"(arg) => ({expression})", arg=arg)


def wait_connected(page) -> None:
    until(page, "window.turncache && window.turncache.controller.session && !window.turncache.controller.loading")


def send(page, text: str) -> None:
    box = page.get_by_label("Message", exact=True)
    box.fill(text)
    box.press("Enter")


def wait_replies(page, n: int) -> None:
    """Wait until `n` replies are finished (each finished reply has a badge)."""
    until(
        page,
        "document.querySelectorAll('#messages .msg-assistant:not(.streaming) .badge').length === arg "
        "&& !window.turncache.controller.generating",
        n,
    )
