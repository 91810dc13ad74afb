"""The UI's ES modules tested one function at a time inside the browser (no DOM of the app involved)."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.browser


def run(page, body: str, arg=None):
    """Evaluate `body` (an async function body) with the modules imported as md, media, stats, store, chart."""
    script = (
        "async (arg) => {"
        " const md = await import('/js/markdown.js');"
        " const media = await import('/js/media.js');"
        " const stats = await import('/js/stats.js');"
        " const store = await import('/js/store.js');"
        " const chart = await import('/js/chart.js');"
        f" {body} }}"
    )
    return page.evaluate(script, arg)


def render(page, text: str) -> dict:
    """The Markdown rendering of `text`: its HTML (serialized by the browser) and the tags it used."""
    return run(
        page,
        "const box = document.createElement('div'); box.append(md.renderMarkdown(arg));"
        " return {html: box.innerHTML, text: box.textContent,"
        " tags: [...new Set([...box.querySelectorAll('*')].map(e => e.tagName.toLowerCase()))].sort(),"
        " hrefs: [...box.querySelectorAll('a')].map(a => a.getAttribute('href')),"
        " attrs: [...box.querySelectorAll('*')].flatMap(e => [...e.attributes].map(a => a.name))};",
        text,
    )


ATTACKS = [
    "<img src=x onerror=alert(1)>",
    "<script>alert(1)</script>",
    '<a href="javascript:alert(1)">x</a>',
    "[x](javascript:alert(1))",
    "[x](JaVaScRiPt:alert(1))",
    "[x](data:text/html,<script>alert(1)</script>)",
    "![x](https://evil.example/pixel.png)",
    "<svg onload=alert(1)>",
    "`<b>` **<i>x</i>** <https://ok.example/?q=<script>>",
    "| a | <b>b</b> |\n|---|---|\n| <img src=x> | [y](vbscript:x) |",
    "> <iframe src=x></iframe>\n- <style>body{}</style>",
]


@pytest.mark.parametrize("attack", ATTACKS)
def test_markdown_never_makes_markup_from_text(page, attack):
    out = render(page, attack)
    assert not set(out["tags"]) & {"img", "script", "iframe", "svg", "style", "b", "i", "object", "embed"}, out
    assert all(h and h.startswith(("https:", "http:", "mailto:")) for h in out["hrefs"]), out
    assert not [a for a in out["attrs"] if a.startswith("on") or a in ("style", "src")], out


def test_markdown_blocks_and_inlines(page):
    out = render(
        page,
        "# Title\n\nSome *em* and **strong** and ~~gone~~ and `x < y`.\nNext line\n\n1. a\n2. b\n"
        "   - nested\n\n> quoted\n\n---\n\n| h1 | h2 |\n|:--|--:|\n| c | d |\n\nsnake_case_name http://a.example/x.",
    )
    assert out["tags"] == sorted(
        [
            "h3",
            "p",
            "em",
            "strong",
            "del",
            "code",
            "br",
            "ol",
            "li",
            "ul",
            "blockquote",
            "hr",
            "div",
            "table",
            "thead",
            "tbody",
            "tr",
            "th",
            "td",
            "a",
        ]
    ), out
    assert "snake_case_name" in out["text"]
    assert out["hrefs"] == ["http://a.example/x"]


def test_markdown_unclosed_fence_renders_as_code_while_streaming(page):
    out = render(page, "Here:\n```js\nconst a = '<b>';")
    assert "code" in out["tags"] and "b" not in out["tags"]
    assert "const a = '<b>';" in out["text"]


def test_markdown_handles_big_and_deep_input(page):
    ms = run(
        page,
        "const t0 = performance.now(); md.renderMarkdown(arg); return performance.now() - t0;",
        "> " * 500 + "*" * 2000 + "[" * 2000,
    )
    assert ms < 2000


def test_badge_text(page):
    out = run(
        page,
        "return [stats.badgeText(stats.compactStats({prompt_tokens: 2010, completion_tokens: 40,"
        " total_tokens: 2050, prompt_tokens_details: {cached_tokens: 1932}}, {ttft_ms: 210, decode_tokens_per_s:"
        " 24.4}, 'stop')), stats.badgeText({p: 5, c: 0, k: 0, ttft: null, tps: 0, fr: 'cancelled'})];",
    )
    assert out == [
        "1,932 of 2,010 prompt tokens cached · first token 0.21 s · 24 tok/s",
        "0 of 5 prompt tokens cached · stopped",
    ]


def test_metrics_parsing(page):
    text = (
        "# HELP turncache_cache_entries x\n# TYPE turncache_cache_entries gauge\n"
        'turncache_cache_entries{tier="device"} 3\nturncache_cache_entries{tier="host"} 1\n'
        'turncache_cache_bytes{tier="device"} 2048\nturncache_cache_hit_ratio 0.75\nturncache_turns_total 4.0\n'
        'turncache_ttft_seconds_bucket{le="+Inf"} 4\n'
    )
    out = run(page, "return stats.cacheFigures(arg);", text)
    assert out["entries"] == {"device": 3, "host": 1}
    assert out["bytes"] == {"device": 2048}
    assert out["hitRatio"] == 0.75 and out["turns"] == 4 and out["cacheEnabled"] is True
    assert run(page, "return stats.cacheFigures('turncache_turns_total 1').cacheEnabled;") is False


def test_media_checks(page):
    out = run(
        page,
        "const f = (name, type, size) => ({name, type, size});"
        " return {"
        " png: media.classify('a.png', 'image/png'), noType: media.classify('a.JPG', ''),"
        " m4a: media.classify('voice.m4a', 'audio/x-m4a'), mkv: media.classify('v.mkv', ''),"
        " gif: media.classify('a.gif', 'image/gif').error,"
        " empty: media.checkFile(f('e.png', 'image/png', 0), []),"
        " big: media.checkFile(f('big.mp4', 'video/mp4', 20 * 2**20), []),"
        " sum: media.checkFile(f('b.mp4', 'video/mp4', 7 * 2**20), [{size: 7 * 2**20}]),"
        " many: media.checkFile(f('c.png', 'image/png', 10), Array(16).fill({size: 1})),"
        " ok: media.checkFile(f('d.wav', 'audio/wav', 1000), []),"
        " content: media.buildContent('hi',"
        "   [{part: {type: 'image_url', image_url: {url: 'data:image/png;base64,AA=='}}}]),"
        " plain: media.buildContent('hi', []),"
        " split: media.splitContent([{type: 'text', text: 'x'}, {type: 'image_url', image_url: {url: 'javascript:1'}},"
        "   {type: 'input_audio', input_audio: {data: 'AAAA', format: 'mp3'}}]),"
        " };",
    )
    assert out["png"] == {"kind": "image", "mime": "image/png"}
    assert out["noType"] == {"kind": "image", "mime": "image/jpeg"}
    assert out["m4a"] == {"kind": "audio", "mime": "audio/x-m4a", "format": "m4a"}
    assert out["mkv"] == {"kind": "video", "mime": "video/x-matroska"}
    assert "You can attach" in out["gif"]
    assert "is empty" in out["empty"]
    assert "at most" in out["big"] and "20.0 MB" in out["big"]
    assert "does not fit" in out["sum"]
    assert "at most 16 attachments" in out["many"]
    assert out["ok"] is None
    assert out["content"] == [
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,AA=="}},
        {"type": "text", "text": "hi"},
    ]
    assert out["plain"] == "hi"
    assert out["split"]["text"] == "x"
    assert [m["src"] for m in out["split"]["media"]] == [None, "data:audio/mpeg;base64,AAAA"]


def test_store_tolerates_corrupt_storage(page):
    out = run(
        page,
        "const mem = new Map(); const storage = {getItem: k => mem.has(k) ? mem.get(k) : null,"
        " setItem: (k, v) => mem.set(k, String(v)), removeItem: k => mem.delete(k)};"
        " const s = new store.LocalStore(storage);"
        " storage.setItem('turncache.sessions', '{not json');"
        " const before = s.sessions();"
        " s.touchSession('sess_a', {title: 'one two three four five six seven eight nine ten'});"
        " s.touchSession('sess_b', {title: 'b'}); s.touchSession('sess_a', {title: 'ignored'});"
        " return {before, ids: s.sessions().map(x => x.id), title: s.sessions()[0].title};",
    )
    assert out == {"before": [], "ids": ["sess_a", "sess_b"], "title": "one two three four five six seven eight…"}


def test_store_keeps_sessions_per_access_token(page):
    out = run(
        page,
        "const mem = new Map(); const storage = {getItem: k => mem.has(k) ? mem.get(k) : null,"
        " setItem: (k, v) => mem.set(k, String(v)), removeItem: k => mem.delete(k)};"
        " const s = new store.LocalStore(storage);"
        " storage.setItem('turncache.sessions', JSON.stringify([{id: 'sess_old', title: 'before tags'}]));"
        " s.setToken('key-of-alice'); s.touchSession('sess_a', {title: 'alice'}); s.setCurrent('sess_a');"
        " s.setToken('key-of-bob'); const bobFirst = s.sessions().map(x => x.id); const bobCurrent = s.current();"
        " s.touchSession('sess_b', {title: 'bob'}); s.setCurrent('sess_b'); s.forgetSession('sess_a');"
        " const bob = s.sessions().map(x => x.id);"
        " s.setToken('key-of-alice'); const alice = s.sessions().map(x => x.id); const aliceCurrent = s.current();"
        " s.setToken(''); const none = s.sessions().map(x => x.id);"
        " return {bobFirst, bobCurrent, bob, alice, aliceCurrent, none, tags: [store.accountTag(''),"
        " store.accountTag('key-of-alice') === store.accountTag('key-of-alice'),"
        " store.accountTag('key-of-alice') !== store.accountTag('key-of-bob'), store.accountTag('k').length]};",
    )
    assert out == {
        "bobFirst": ["sess_old"],  # an entry from before tags: listed for every token
        "bobCurrent": None,
        "bob": ["sess_b", "sess_old"],  # bob forgetting sess_a does not touch alice's entry
        "alice": ["sess_a", "sess_old"],
        "aliceCurrent": "sess_a",
        "none": ["sess_old"],
        "tags": ["", True, True, 8],
    }


def test_chart_draws_one_bar_pair_per_turn(page):
    out = run(
        page,
        "const svg = chart.cacheChart(arg); return {cached: svg.querySelectorAll('.bar-cached').length,"
        " dots: svg.querySelectorAll('.ratio-dot').length, title: svg.querySelector('title').textContent};",
        [{"p": 10, "k": 0}, {"p": 30, "k": 12}, {"p": 50, "k": 40}],
    )
    assert out == {"cached": 3, "dots": 3, "title": "Cached prompt tokens per turn; last turn 80 % cached"}


CONTROLLER_HARNESS = """
  const { ChatController } = await import('/js/chat.js');
  const { LocalStore } = await import('/js/store.js');
  const mem = new Map();
  const storage = {getItem: k => mem.has(k) ? mem.get(k) : null, setItem: (k, v) => mem.set(k, String(v)),
                   removeItem: k => mem.delete(k)};
  const sent = [];
  const conn = new EventTarget();
  conn.isOpen = true;
  let n = 0;
  conn.send = (e) => { const id = `e${++n}`; sent.push({...e, event_id: id}); return id; };
  const c = new ChatController(conn, new LocalStore(storage), () => ({sampling: {}}));
  const restored = [];
  c.addEventListener('restore', e => restored.push(e.detail.text));
  const emit = (ev) => conn.dispatchEvent(new CustomEvent('message', {detail: ev}));
  const usage = {prompt_tokens: 3, completion_tokens: 1, total_tokens: 4, prompt_tokens_details: {cached_tokens: 0}};
  const done = (turn_id, extra) => emit({type: 'reply.done', turn_id, text: '', finish_reason: 'stop', usage,
                                         timings: {}, ...extra});
  conn.dispatchEvent(new Event('open'));
  emit({type: 'session.created', reply_to: sent[0].event_id,
        session: {id: 'sess_1', model: 'm', sampling: {}, messages: 0, state: 'idle'}});
  const ids = () => c.messages.map(m => m.id).join(',');
  const started = (i, turn_id, user_message_id) =>  // turn.started answering the i-th event sent
    emit({type: 'turn.started', reply_to: sent[i].event_id, turn_id, kind: 'create', user_message_id});
"""


def test_controller_commits_like_the_server(page):
    out = run(
        page,
        CONTROLLER_HARNESS
        + """
        const log = [];
        c.send('hi', 'hi');                                           // answered
        started(1, 't1', 'u1');
        emit({type: 'reply.delta', turn_id: 't1', delta: 'yo'});
        done('t1', {message_id: 'a1', text: 'yo'});
        log.push(ids());
        c.send('again', 'again');                                     // cancelled before any text
        started(2, 't2', 'u2');
        c.stop();
        done('t2', {finish_reason: 'cancelled'});
        log.push(ids() + ' ' + sent[3].type + ':' + sent[3].turn_id);
        c.regenerate();                                               // fails: the old reply stays
        started(4, 't3', 'u1');
        emit({type: 'error', code: 'internal', message: 'boom', turn_id: 't3'});
        done('t3', {finish_reason: 'error'});
        log.push(ids());
        c.edit('u1', 'better');                                       // an edit replaces everything from u1
        started(5, 't4', 'u3');
        done('t4', {message_id: 'a4', text: 'ok'});
        log.push(ids());
        c.send('bad', 'bad draft');                                   // refused before it started
        emit({type: 'error', code: 'busy', message: 'no', reply_to: sent[6].event_id});
        log.push(String(c.generating) + ' ' + restored.join('|'));
        return {log, series: c.series().length};
        """,
    )
    assert out["log"] == ["u1,a1", "u1,a1 turn.cancel:t2", "u1,a1", "u3,a4", "false bad draft"]
    assert out["series"] == 1  # the chart follows the conversation: a1 was replaced by the edit


def test_a_replys_thinking_is_split_off_and_shown_as_plain_text(page):
    out = page.evaluate(
        "async () => { const r = await import('/js/reasoning.js');"
        " const box = r.reasoningBox('<img src=x onerror=alert(1)> 2+2', false);"
        " return {whole: r.splitThinking('<think>\\nhmm\\n</think>\\n\\nIt is **4**.'),"
        " open: r.splitThinking('<think>still going'), opening: r.splitThinking('<thi'),"
        " plain: r.splitThinking('No thinking here.'),"
        " html: box.innerHTML, tags: [...box.querySelectorAll('*')].map(e => e.tagName.toLowerCase())}; }"
    )
    assert out["whole"] == {"reasoning": "hmm", "answer": "It is **4**.", "thinking": False}
    assert out["open"] == {"reasoning": "still going", "answer": "", "thinking": True}
    assert out["opening"] == {"reasoning": "", "answer": "", "thinking": True}  # may be opening the block
    assert out["plain"] == {"reasoning": None, "answer": "No thinking here.", "thinking": False}
    assert out["tags"] == ["summary", "div"] and "&lt;img" in out["html"]


def test_controller_carries_tools_and_answers_calls_like_the_server(page):
    out = run(
        page,
        CONTROLLER_HARNESS.replace(
            "() => ({sampling: {}}));",
            "() => ({sampling: {}}),"
            " () => ({tools: [{type: 'function', function: {name: 'f'}}], tool_choice: 'auto'}));",
        )
        + """
        const call = {id: 'call_1', type: 'function', function: {name: 'f', arguments: '{}'}};
        c.send('use f', 'use f');
        started(1, 't1', 'u1');
        emit({type: 'reply.tool_call', turn_id: 't1', index: 0, call});
        done('t1', {message_id: 'a1', finish_reason: 'tool_calls', tool_calls: [call]});
        const pending = c.pendingCalls().map(x => x.id);
        const offered = sent[1].tools.map(t => t.function.name).join(',') + ' ' + sent[1].tool_choice;
        c.sendToolResults([{tool_call_id: 'call_1', content: '42'}]);
        const results = sent[2];
        const shown = c.displayMessages().map(m => m.role).join(',');
        started(2, 't2', 'm3');
        done('t2', {message_id: 'a2', text: 'It is 42.'});
        return {pending, offered, results: {type: results.type, results: results.results, tools: !!results.tools},
                shown, after: c.pendingCalls().length, asked: sent.at(-1).type,
                };
        """,
    )
    assert out["pending"] == ["call_1"] and out["offered"] == "f auto"
    assert out["results"] == {
        "type": "tool.results",
        "results": [{"tool_call_id": "call_1", "content": "42"}],
        "tools": True,
    }
    assert out["shown"] == "user,assistant,tool,assistant"  # the results, then the reply being written
    assert out["after"] == 0
    assert out["asked"] == "conversation.get"  # the tool messages' ids come from the server
