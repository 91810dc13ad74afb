"""What the persistence tests share: a session's turns, messages with images, and what a store wrote."""

from __future__ import annotations

import base64
import io
import sqlite3
import time
from pathlib import Path

from PIL import Image

from chat.protocol.client_events import TurnCreate
from chat.protocol.content import ConversationMessage
from chat.protocol.server_events import Timings, Usage
from chat.protocol.session import Session
from chat.server.persistence.session_db import SqliteSessionStore


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
