"""How ``sessions_v1.sqlite3`` was made: with the session store of commit f504f2c (one JSON value per session),
before the store moved to one row per message. Kept to show what the file holds; it only runs against that commit:

    git worktree add /tmp/v1 f504f2c && cd /tmp/v1 && python tests/chat/server/data/make_sessions_v1.py OUT

Sessions (ids from one counter): ``sess_1`` (system prompt, sampling, two turns, an image in the first user message and
the same image again in the second), ``sess_8`` (a turn was generating when the file was written), ``sess_11`` (no
messages).
"""

from __future__ import annotations

import base64
import io
import itertools
import sys

from PIL import Image

from chat.protocol.client_events import SessionUpdate, TurnCreate
from chat.protocol.sampling import SamplingSettings
from chat.protocol.server_events import Timings, Usage
from chat.server.persistence.session_db import SqliteSessionStore


def png(color: str) -> str:
    out = io.BytesIO()
    Image.new("RGB", (4, 4), color).save(out, format="PNG")
    return "data:image/png;base64," + base64.b64encode(out.getvalue()).decode()


def main(path: str) -> None:
    counter = itertools.count(1)
    store = SqliteSessionStore(path, new_id=lambda prefix: f"{prefix}_{next(counter)}")
    image = {"type": "image_url", "image_url": {"url": png("red")}}
    first = store.create("fake", system="be brief", sampling=SamplingSettings(temperature=0.5, seed=3))
    for content, reply in (
        ([{"type": "text", "text": "what is this?"}, image], "a red square"),
        ([image, {"type": "text", "text": "and again?"}], "still red"),
    ):
        plan = first.create_turn(TurnCreate(content=content))
        store.save(first)
        first.on_done(plan.turn_id, reply, "stop", Usage.of(10, 3), Timings())
        store.save(first)
    second = store.create("fake")
    second.update(SessionUpdate(system="terse"))
    store.save(second)
    plan = second.create_turn(TurnCreate(content="cut off"))
    store.save(second)  # written as generating: the restart interrupts it
    store.create("fake")
    store.close()


if __name__ == "__main__":
    main(sys.argv[1])
