"""Per-turn result records and the results file (JSONL) that an interrupted run resumes from.

A conversation's records are written together, with one ``write`` and an ``fsync``, only once the conversation is
over. A run killed mid-write can leave at most a partial last conversation (missing turns, or a cut last line);
:meth:`ResultsFile.open` drops it by rewriting the file's complete conversations to a temporary file and renaming it
over the old one, so the file on disk is always either the old one or a clean one.

A conversation is *finished* in the file when it has one record for each of its ``turns`` turn indices.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from chat.tools.client.reply import Reply

Record = dict[str, Any]


def normalize(text: str) -> str:
    """The form compared for exact match: whitespace runs collapsed to one space, ends stripped, casefolded."""
    return " ".join(text.split()).casefold()


def exact_match(reply: str | None, references: Iterable[str] | None) -> bool | None:
    """None without references; else whether the reply equals one of them after :func:`normalize` (a failed turn,
    ``reply is None``, is a miss)."""
    if references is None:
        return None
    if reply is None:
        return False
    return any(normalize(reply) == normalize(ref) for ref in references)


def turn_record(
    conversation: str,
    line: int,
    turn: int,
    turns: int,
    mode: str,
    *,
    reply: Reply | None = None,
    references: tuple[str, ...] | None = None,
    error: tuple[str, str] | None = None,
) -> Record:
    """One line of the results file (fields documented in docs/eval.md)."""
    text = reply.text if reply is not None and error is None else None
    record: Record = {
        "id": conversation,
        "line": line,
        "turn": turn,
        "turns": turns,
        "mode": mode,
        "reply": text,
        "finish_reason": reply.finish_reason if reply is not None else None,
        "usage": None,
        "timings": None,
        "reference": None if references is None else (references[0] if len(references) == 1 else list(references)),
        "exact_match": exact_match(text, references),
        "error": None if error is None else {"code": error[0], "message": error[1]},
    }
    if reply is not None:
        record["usage"] = {
            "prompt_tokens": reply.usage.prompt_tokens,
            "cached_tokens": reply.cached_tokens,
            "completion_tokens": reply.usage.completion_tokens,
        }
        record["timings"] = reply.timings.model_dump(exclude_none=True)
    return record


@dataclass(frozen=True, slots=True)
class Resumed:
    """What an existing results file held."""

    records: list[Record]  # the complete conversations' records, conversations in file order, turns in order
    finished: dict[str, int]  # conversation id -> its number of turns, for each complete conversation
    dropped: int  # partial conversations removed from the file
    unreadable: int  # lines removed because they are not records (a line cut by a kill, or foreign text)


def read_results(path: Path) -> Resumed:
    """The complete conversations in ``path`` (empty when it does not exist).

    Raises:
        OSError: the file exists but cannot be read.
    """
    if not path.exists():
        return Resumed([], {}, 0, 0)
    lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    by_id: dict[str, list[Record]] = {}
    cut = 0
    for text in lines:
        record = _record(text)
        if record is None:
            cut += 1
            continue
        by_id.setdefault(record["id"], []).append(record)
    finished = {cid: recs[0]["turns"] for cid, recs in by_id.items() if _complete(recs)}
    records = [r for recs in by_id.values() if recs[0]["id"] in finished for r in _one_each(recs)]
    return Resumed(records, finished, len(by_id) - len(finished), cut)


class ResultsFile:
    """The results JSONL, opened for appending whole conversations."""

    def __init__(self, path: Path, handle: TextIO) -> None:
        self.path = path  # where the results live
        self._handle = handle  # opened for appending

    @classmethod
    def open(cls, path: Path, keep: list[Record], rewrite: bool) -> ResultsFile:
        """Open ``path`` for appending; first, when ``rewrite``, replace its content by ``keep`` (atomically)."""
        if rewrite:
            tmp = path.with_name(path.name + ".tmp")
            with tmp.open("w", encoding="utf-8") as out:
                out.write("".join(_line(r) for r in keep))
                out.flush()
                os.fsync(out.fileno())
            os.replace(tmp, path)
        return cls(path, path.open("a", encoding="utf-8"))

    def write_conversation(self, records: list[Record]) -> None:
        """Append one conversation's records at once and make them durable."""
        self._handle.write("".join(_line(r) for r in records))
        self._handle.flush()
        os.fsync(self._handle.fileno())

    def close(self) -> None:
        self._handle.close()


# ---------------------------------------------------------------- internals


def _line(record: Record) -> str:
    return json.dumps(record, ensure_ascii=False) + "\n"


def _record(text: str) -> Record | None:
    """A parsed record, or None for a cut or foreign line."""
    try:
        record = json.loads(text)
    except json.JSONDecodeError:
        return None
    if not isinstance(record, dict):
        return None
    ok = (
        isinstance(record.get("id"), str)
        and isinstance(record.get("turn"), int)
        and isinstance(record.get("turns"), int)
        and 0 <= record["turn"] < record["turns"]
    )
    return record if ok else None


def _complete(records: list[Record]) -> bool:
    turns = records[0]["turns"]
    return all(r["turns"] == turns for r in records) and {r["turn"] for r in records} == set(range(turns))


def _one_each(records: list[Record]) -> list[Record]:
    """The last record of each turn index (a resumed run never writes a conversation twice, but be safe)."""
    last = {r["turn"]: r for r in records}
    return [last[i] for i in sorted(last)]
