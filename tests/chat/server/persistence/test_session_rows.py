"""The sessions database, one row per message: a turn's write is O(new messages), media are stored once, a file of
the previous format is migrated on open, two processes can share the file, and a failed write leaves the server
serving from memory."""

from __future__ import annotations

import asyncio
import base64
import io
import itertools
import json
import shutil
import sqlite3
import time
from pathlib import Path

import httpx
import pytest
from PIL import Image
from websockets.asyncio.client import connect

from chat.protocol.client_events import TurnCreate, TurnEdit, TurnRegenerate
from chat.protocol.content import ConversationMessage
from chat.protocol.errors import ErrorCode, ProtocolError
from chat.protocol.server_events import Timings, Usage
from chat.protocol.session import Session, SessionState
from chat.server.persistence.session_db import SqliteSessionStore
from chat.server.persistence.session_rows import FORMAT, SessionDbError
from chat.server.persistence.session_writer import common_prefix
from tests.chat.server.conftest import make_server
from tests.chat.server.surfaces.test_ws import Client, ws_url

V1_FILE = Path(__file__).parents[1] / "data" / "sessions_v1.sqlite3"


def png(seed: int, size: int = 48) -> str:
    """A PNG data URL of noise (so it does not compress away): a few kB of base64."""
    pixels = bytes((seed * 7919 + i * 104729) % 251 for i in range(size * size * 3))
    out = io.BytesIO()
    Image.frombytes("RGB", (size, size), pixels).save(out, format="PNG")
    return "data:image/png;base64," + base64.b64encode(out.getvalue()).decode()


def user(text: str, image: str | None = None) -> ConversationMessage:
    content = (
        text if image is None else [{"type": "text", "text": text}, {"type": "image_url", "image_url": {"url": image}}]
    )
    return ConversationMessage.model_validate(
        {"id": f"msg_{time.perf_counter_ns():024x}", "role": "user", "content": content}
    )


def reply(text: str) -> ConversationMessage:
    return ConversationMessage(
        id=f"msg_{time.perf_counter_ns():024x}", role="assistant", content=text, finish_reason="stop"
    )


def one_turn(session: Session, content, answer: str) -> None:
    plan = session.create_turn(TurnCreate(content=content))
    session.on_done(plan.turn_id, answer, "stop", Usage.of(5, 2), Timings())


def written(store: SqliteSessionStore) -> tuple[int, int, int]:
    store.flush()
    w = store.writer.stats.work
    return w.rows, w.bytes, w.deleted


def rows(path: Path, table: str) -> int:
    with sqlite3.connect(path) as db:
        return db.execute(f"SELECT COUNT(*) FROM {table}").fetchone()[0]


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


def test_a_database_of_the_previous_format_is_migrated_on_open(tmp_path):
    path = tmp_path / "sessions.sqlite3"
    shutil.copy(V1_FILE, path)
    store = SqliteSessionStore(path)
    other = SqliteSessionStore(path)  # a second process opening the file: it is migrated once
    first = store.get("sess_1", owner="default")
    assert (first.system, first.sampling.temperature, first.sampling.seed) == ("be brief", 0.5, 3)
    assert [m.role for m in first.messages] == ["user", "assistant"] * 2
    assert first.messages[1].content == "a red square" and first.messages[0].content[1].type == "image_url"
    assert first.messages[0].content[1] == first.messages[2].content[0]  # the same image, stored once below
    interrupted = other.get("sess_8", owner="default")
    assert interrupted.interrupted_turn_id == "turn_10" and interrupted.messages == [] and interrupted.system == "terse"
    assert other.get("sess_11", owner="default").messages == []
    for owner in ("", "alice"):  # migrated sessions belong to the tenant "default" only
        with pytest.raises(ProtocolError) as info:
            store.get("sess_11", owner=owner)
        assert info.value.code is ErrorCode.UNKNOWN_SESSION
    one_turn(first, "a third question", "a third answer")
    store.save(first)
    store.close()
    other.close()
    with sqlite3.connect(path) as db:
        assert db.execute("PRAGMA user_version").fetchone()[0] == FORMAT
        tables = {name for (name,) in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    assert "sessions_v1" not in tables and rows(path, "media") == 1
    assert len(SqliteSessionStore(path).get("sess_1", owner="default").messages) == 6


def test_an_unreadable_old_row_is_kept_aside_not_lost(tmp_path):
    path = tmp_path / "sessions.sqlite3"
    shutil.copy(V1_FILE, path)
    with sqlite3.connect(path) as db:
        db.execute("UPDATE sessions SET messages = '[{\"broken\": ' WHERE id = 'sess_11'")
    store = SqliteSessionStore(path)
    assert len(store.get("sess_1", owner="default").messages) == 4
    with pytest.raises(ProtocolError):
        store.get("sess_11", owner="default")
    store.close()
    assert rows(path, "sessions_v1_unmigrated") == 1


def test_a_file_of_another_format_or_unwritable_is_refused_naming_it(tmp_path):
    newer = tmp_path / "newer.sqlite3"
    with sqlite3.connect(newer) as db:
        db.execute(f"PRAGMA user_version = {FORMAT + 1}")
    with pytest.raises(SessionDbError, match=str(newer)):
        SqliteSessionStore(newer)
    foreign = tmp_path / "foreign.sqlite3"
    with sqlite3.connect(foreign) as db:
        db.execute("CREATE TABLE sessions (something TEXT)")
    with pytest.raises(SessionDbError, match="unknown format"):
        SqliteSessionStore(foreign)
    not_a_db = tmp_path / "not.sqlite3"
    not_a_db.write_bytes(b"this is not a database" * 100)
    with pytest.raises(SessionDbError, match=str(not_a_db)):
        SqliteSessionStore(not_a_db)


def test_two_processes_sharing_the_file_keep_every_session_whole(tmp_path):
    path = tmp_path / "shared.sqlite3"
    counter = itertools.count()
    ids = lambda prefix: f"{prefix}_{next(counter):06d}"  # noqa: E731 - unique across both stores
    a, b = SqliteSessionStore(path, new_id=ids), SqliteSessionStore(path, new_id=ids)
    shared = a.create("fake", owner="t")
    one_turn(shared, "first", "one")
    a.save(shared)
    a.flush()
    own_b = b.create("fake", owner="t")
    one_turn(own_b, "b's own", "b")
    b.save(own_b)
    in_b = b.get(shared.id, owner="t")  # read from disk by the other process
    one_turn(in_b, "second, from b", "two-b")
    b.save(in_b)
    b.flush()
    one_turn(shared, "second, from a", "two-a")  # a's copy is stale: its write finds b's version and rewrites whole
    a.save(shared)
    a.close()
    b.close()
    third = SqliteSessionStore(path)
    assert [m.content for m in third.get(shared.id, owner="t").messages] == ["first", "one", "second, from a", "two-a"]
    assert [m.content for m in third.get(own_b.id, owner="t").messages] == ["b's own", "b"]


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


def test_a_session_of_another_owner_reads_as_missing(tmp_path):
    store = SqliteSessionStore(tmp_path / "s.sqlite3")
    alice = store.create("fake", owner="alice")
    store.close()
    again = SqliteSessionStore(tmp_path / "s.sqlite3")
    answers = []
    for sid in (alice.id, "sess_missing"):
        with pytest.raises(ProtocolError) as info:
            again.get(sid, "e", owner="bob")
        answers.append((info.value.code, info.value.event_id, info.value.message.replace(sid, "<id>")))
    assert answers[0] == answers[1]
    assert alice.id not in again  # nothing was loaded for bob
    assert again.get(alice.id, owner="alice").state is SessionState.IDLE


def test_rows_that_do_not_fit_together_are_an_internal_error_for_that_session_only(tmp_path):
    store = SqliteSessionStore(tmp_path / "s.sqlite3")
    broken, fine = store.create("fake"), store.create("fake")
    for s in (broken, fine):
        one_turn(
            s, [{"type": "text", "text": "look"}, {"type": "image_url", "image_url": {"url": png(s is fine)}}], "ok"
        )
        store.save(s)
    store.close()
    with sqlite3.connect(store.path) as db:
        db.execute(
            "DELETE FROM media WHERE hash IN (SELECT hash FROM message_media WHERE session_id = ?)", (broken.id,)
        )
    again = SqliteSessionStore(store.path)
    with pytest.raises(ProtocolError) as info:
        again.get(broken.id)
    assert info.value.code is ErrorCode.INTERNAL
    assert len(again.get(fine.id).messages) == 2


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


def test_a_reply_is_acknowledged_once_it_is_on_disk(tmp_path, monkeypatch):
    """reply.done (and session.created) go out after their write: a crash right after them loses nothing."""
    import chat.server.persistence.session_writer as writer_module

    slow = writer_module.insert_messages

    def slow_insert(*args, **kwargs):
        time.sleep(0.3)  # a slow disk
        return slow(*args, **kwargs)

    monkeypatch.setattr(writer_module, "insert_messages", slow_insert)
    path = tmp_path / "sessions.sqlite3"
    engine, srv = make_server(sessions_db=str(path))

    def on_disk(session_id: str) -> tuple[int, int]:
        with sqlite3.connect(path) as db:
            sessions = db.execute("SELECT COUNT(*) FROM sessions WHERE id = ?", (session_id,)).fetchone()[0]
            messages = db.execute("SELECT COUNT(*) FROM messages WHERE session_id = ?", (session_id,)).fetchone()[0]
        return sessions, messages

    with srv:

        async def scenario() -> list[tuple[int, int]]:
            async with connect(ws_url(srv)) as ws:
                c = Client(ws)
                await c.send(type="session.create")
                created, _ = await c.until("session.created")
                session_id = created["session"]["id"]
                seen = [on_disk(session_id)]
                await c.turn("keep me")
                seen.append(on_disk(session_id))
                return seen

        assert asyncio.run(scenario()) == [(1, 0), (1, 2)]
    engine.close()


def _tool_round(session: Session) -> None:
    from chat.protocol.client_events import ToolResults
    from chat.protocol.tools import AssistantToolCall

    plan = session.create_turn(TurnCreate(content="weather?"))
    call = AssistantToolCall.model_validate({"id": "call_1", "function": {"name": "f", "arguments": '{"a":1}'}})
    session.on_done(plan.turn_id, "", "tool_calls", Usage.of(5, 2), Timings(), [call])
    results = ToolResults.model_validate({"results": [{"tool_call_id": "call_1", "content": "sunny"}]})
    plan = session.tool_results(results)
    session.on_done(plan.turn_id, "It is sunny.", "stop", Usage.of(9, 2), Timings())


def test_tool_calls_and_results_are_kept_and_a_format_2_file_gets_their_column(tmp_path):
    path = tmp_path / "sessions.sqlite3"
    store = SqliteSessionStore(path)
    plain = store.create("fake", owner="t")
    one_turn(plain, "hello", "hi")
    store.save(plain)
    store.close()
    with sqlite3.connect(path) as db:  # as format 2 wrote it: no tools column
        db.execute("ALTER TABLE messages DROP COLUMN tools")
        db.execute("PRAGMA user_version = 2")
    store = SqliteSessionStore(path)
    assert [m.content for m in store.get(plain.id, owner="t").messages] == ["hello", "hi"]
    session = store.create("fake", owner="t")
    _tool_round(session)
    store.save(session)
    store.close()
    with sqlite3.connect(path) as db:
        assert db.execute("PRAGMA user_version").fetchone()[0] == FORMAT == 3
    back = SqliteSessionStore(path).get(session.id, owner="t")
    assert back.messages == session.messages
    assert back.messages[1].tool_calls[0].id == "call_1" and back.messages[2].tool_call_id == "call_1"
    back.check_invariants()
