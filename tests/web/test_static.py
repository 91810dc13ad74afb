"""Checks of the web/ files that need no browser: no HTML sinks, a strict CSP, local references only."""

from __future__ import annotations

import json
import re
from pathlib import Path

WEB = Path(__file__).resolve().parents[2] / "web"
SCRIPTS = sorted(WEB.rglob("*.js"))

# Ways to turn a string into markup or code. The UI builds nodes and sets textContent instead.
SINKS = re.compile(
    r"\.(inner|outer)HTML\b|insertAdjacentHTML|document\.write|\beval\s*\(|new\s+Function\b|createContextualFragment"
    r"|setAttribute\(\s*[\"']on|\.srcdoc\b|DOMParser"
)


def test_there_are_scripts():
    assert (WEB / "index.html").is_file()
    assert (WEB / "__init__.py").is_file()
    assert {p.name for p in SCRIPTS} >= {"app.js", "markdown.js", "connection.js", "chat.js", "media.js"}


def test_no_script_turns_strings_into_markup():
    found = [
        f"{p.relative_to(WEB)}:{i}: {line.strip()}"
        for p in SCRIPTS
        for i, line in enumerate(p.read_text().splitlines(), 1)
        if SINKS.search(line)
    ]
    assert not found, found


def test_page_has_a_strict_content_security_policy():
    html = (WEB / "index.html").read_text()
    csp = re.search(r'http-equiv="Content-Security-Policy"\s+content="([^"]+)"', html)
    assert csp, "index.html must declare a CSP"
    policy = dict(part.strip().split(" ", 1) for part in csp.group(1).split(";") if part.strip())
    assert policy["script-src"] == "'self'"
    assert "unsafe" not in csp.group(1)
    assert policy["object-src"] == "'none'"
    assert "<script>" not in html  # no inline scripts
    assert not re.search(r"<[^>]*\son[a-z]+\s*=", html)  # no inline event handlers


def test_pages_reference_only_local_files():
    for p in [WEB / "index.html", WEB / "style.css", *SCRIPTS]:
        text = p.read_text()
        urls = re.findall(r"(?:src|href)=\"(https?:[^\"]+)\"|@import|url\((?!data:)['\"]?https?:", text)
        assert not urls, (p, urls)
    for p in SCRIPTS:
        for spec in re.findall(r"^import .*? from \"([^\"]+)\";", p.read_text(), re.M):
            assert spec.startswith("./"), (p, spec)
            assert (p.parent / spec).resolve().is_file(), (p, spec)


def test_page_limits_match_the_protocol():
    from chat.protocol import limits

    text = (WEB / "js" / "limits.js").read_text()
    found = dict(re.findall(r"^export const (\w+) = (.+?);", text, re.M))
    assert found, "web/js/limits.js exports no limits"
    for name, value in found.items():
        expected = getattr(limits, name)
        if isinstance(expected, tuple):
            assert json.loads(value) == list(expected), name
        else:
            assert float(value) == expected, name
