"""The session writer (``chat/server/persistence/session_writer.py``): writes off the event loop, O(new messages)
per turn, media once, a failed batch logged and counted while the sessions stay in memory."""

from __future__ import annotations

import asyncio
import json
import sqlite3
import time

import httpx
from websockets.asyncio.client import connect

from chat.protocol.client_events import TurnEdit, TurnRegenerate
from chat.protocol.server_events import Timings, Usage
from chat.server.persistence.session_db import SqliteSessionStore
from chat.server.persistence.session_writer import common_prefix
from tests.chat.server.conftest import make_server
from tests.chat.server.persistence.conftest import one_turn, png, reply, rows, user, written
from tests.chat.server.surfaces.test_ws import Client, ws_url


def test_a_300_turn_conversation_with_images_writes_the_same_work_every_turn(tmp_path):
    """Per-turn work (rows, bytes) is flat; the old format rewrote the whole conversation every turn."""
    store = SqliteSessionStore(tmp_path / "s.sqlite3")
    session = store.create("fake", system="describe the pictures", owner="alice")
    images = [png(i) for i in range(3)]
    stored: set[str] = set()
    per_turn, seconds, old_format_bytes = [], [], []
    for turn in range(300):
        # now and then an image never seen before, else one of three
        image = png(100 + turn) if turn % 25 == 0 else images[turn % 3]
        new_image, _ = image not in stored, stored.add(image)
        before = written(store)
        started = time.perf_counter()
        session.messages = [
            *session.messages,
            user(f"turn {turn:04d}: and this one?", image),
            reply(f"answer {turn:04d}"),
        ]
        store.save(session)
        after = written(store)
        seconds.append(time.perf_counter() - started)
        per_turn.append((after[0] - before[0], after[1] - before[1], new_image))
        old_format_bytes.append(len(json.dumps([m.model_dump(mode="json") for m in session.messages])))
    seen = [(r, b) for r, b, new in per_turn if not new]
    assert {r for r, _ in seen} == {4}  # the header, two messages, one media reference: whatever the turn
    assert max(b for _, b in seen) - min(b for _, b in seen) <= 8  # flat, to the digit of a position
    first_seen_bytes = seen[0][1]
    assert first_seen_bytes < len(images[0])  # a seen image is referenced, not written again
    assert all(b > len(images[0]) for _, b, new in per_turn if new)  # a new one is written, once
    assert old_format_bytes[-1] > 100 * first_seen_bytes  # what one turn cost before: the whole conversation
    assert rows(store.path, "media") == 3 + 12  # every image once
    early, late = sum(seconds[10:60]) / 50, sum(seconds[-50:]) / 50
    print(
        f"\nwrite per turn: {early * 1e3:.2f} ms (turns 10-59), {late * 1e3:.2f} ms (last 50); "
        f"{seen[-1][1]} bytes vs {old_format_bytes[-1]} for the whole conversation"
    )
    store.close()
    again = SqliteSessionStore(store.path).get(session.id, owner="alice")
    assert again.messages == session.messages


def test_regenerate_and_edit_write_only_what_changed_and_drop_unreferenced_media(tmp_path):
    store = SqliteSessionStore(tmp_path / "s.sqlite3")
    session = store.create("fake")
    kept, dropped = png(1), png(2)
    for i, image in enumerate((kept, kept, dropped)):
        one_turn(
            session, [{"type": "text", "text": f"q{i}"}, {"type": "image_url", "image_url": {"url": image}}], f"a{i}"
        )
        store.save(session)
    written(store)
    assert rows(store.path, "media") == 2
    before = written(store)
    plan = session.regenerate(TurnRegenerate())
    session.on_done(plan.turn_id, "another a2", "stop", Usage.of(5, 2), Timings())
    store.save(session)
    after = written(store)
    assert (after[0] - before[0], after[2] - before[2]) == (2, 1)  # header + the new reply; the old reply deleted
    plan = session.edit(TurnEdit(index=2, content="no picture this time"))
    session.on_done(plan.turn_id, "fine", "stop", Usage.of(5, 2), Timings())
    store.save(session)
    store.flush()
    assert rows(store.path, "media") == 1  # the edited-away image is gone; the one still referenced stays
    assert rows(store.path, "messages") == 4
    store.close()
    assert SqliteSessionStore(store.path).get(session.id).messages == session.messages


def test_common_prefix_is_found_from_the_end():
    assert common_prefix(("a", "b"), ("a", "b", "c", "d")) == 2
    assert common_prefix(("a", "b", "c", "d"), ("a", "b", "x", "y")) == 2
    assert common_prefix(("a", "b", "c", "d"), ("a", "b", "c")) == 3
    assert common_prefix(("a",), ("x", "y")) == 0
    assert common_prefix((), ("x",)) == 0


def test_a_failed_write_keeps_the_server_serving_from_memory(tmp_path, caplog):
    path = tmp_path / "sessions.sqlite3"
    engine, srv = make_server(sessions_db=str(path))
    store: SqliteSessionStore = srv.app.state.sessions
    with srv:
        session = store.create("fake")
        store.flush()
        writable = store.writer._db
        store.writer._db = sqlite3.connect(
            f"file:{path}?mode=ro", uri=True, isolation_level=None, check_same_thread=False
        )
        one_turn(session, "while the disk is full", "still here")
        store.save(session)
        store.flush()
        metrics = httpx.get(f"{srv.url}/metrics", timeout=30).text
        assert "turncache_session_write_failures_total 1" in metrics
        assert any("kept in memory" in r.getMessage() for r in caplog.records)
        assert store.get(session.id).messages[-1].content == "still here"  # served from memory
        store.writer._db.close()
        store.writer._db = writable  # the disk has room again: the next write rewrites the session whole
        one_turn(session, "and after", "back")
        store.save(session)
    engine.close()
    assert [m.content for m in SqliteSessionStore(path).get(session.id).messages][-2:] == ["and after", "back"]
    assert len(SqliteSessionStore(path).get(session.id).messages) == 4


def test_writes_never_block_the_event_loop(tmp_path):
    """Another process holds the file's write lock: turns still stream; their rows land once it lets go."""
    path = tmp_path / "sessions.sqlite3"
    engine, srv = make_server(sessions_db=str(path))
    store: SqliteSessionStore = srv.app.state.sessions
    with srv:
        blocker = sqlite3.connect(path, isolation_level=None)
        blocker.execute("BEGIN IMMEDIATE")  # the writer thread now waits (up to 30 s) for the lock

        async def one_turn_over_ws() -> tuple[str, dict]:
            async with connect(ws_url(srv)) as ws:
                c = Client(ws)
                await c.send(type="session.create")
                created, _ = await c.until("session.created")
                return created["session"]["id"], await c.turn("one")

        session_id, done = asyncio.run(one_turn_over_ws())  # acknowledgments wait 1 s each for the disk, no more
        assert done["finish_reason"] == "stop"
        assert store.writer.pending > 0  # nothing could be written yet
        blocker.execute("ROLLBACK")
        blocker.close()
        assert store.flush(timeout=30)
    engine.close()
    assert len(SqliteSessionStore(path).get(session_id, owner="default").messages) == 2
