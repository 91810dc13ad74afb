"""Token ids of rendered chat texts that reuse the token ids of earlier renders they begin with.

A stateless request (OpenAI's chat completions) sends the whole conversation every turn. The chat template renders it
to a text that begins as the previous turn's text did, and tokenizing all of it again is the costly part of a render:
a 4,900-token conversation took 0.3 ms to render and 70-90 ms to tokenize here (SmolLM2's tokenizer, on the engine's
thread, holding the GIL). :class:`PromptEncoder` keeps the ids of recent renders and, for a new text, takes those of
the longest earlier text it begins with, up to a *cut*, and tokenizes only the rest. The template is still rendered
in full every time, so a template that renders the history otherwise than before (thinking dropped from earlier
replies, tool calls re-serialized) gives another text, which shares less with the earlier one or nothing.

**Cuts, and why the result is exact.** A Hugging Face fast tokenizer first splits its input at its added tokens that
are not normalized (leftmost-longest matches on the raw text); every piece between them is then normalized,
pre-tokenized and modelled on its own, and each added token is one token. A cut is the start of such an added token
that matches on both sides of it alone as it does inside the text: not ``lstrip`` (it would take whitespace from the
piece before it), not ``rstrip`` and not ``single_word`` (its match would depend on the text around it). Chat
templates write one at every message's start and end (``<|im_start|>``, ``<|im_end|>``, ``<start_of_turn>``, ...).
Then the ids of ``text[:cut]`` are those of the pieces before the cut, which do not depend on what follows, and the
ids of ``text[cut:]`` encoded alone are those of the rest: it begins with the same added token, so its pieces are the
same pieces (none of them is the input's first, which some pre-tokenizers treat apart). The tokenizer's own behaviour
is what this rests on, so it is checked, not assumed: tests compare against full encodes on random conversations of
every family's template and on tokenizers built with other pipelines (Metaspace, prepended normalizers, stripping
added tokens); in service the first :data:`CHECK_FIRST` renders and one in :data:`CHECK_EVERY` after them are checked
against a full encode, and a difference turns reuse off for that tokenizer (logged as an error) and returns the full
encode's ids. A tokenizer that is not a fast one is never reused from. (Renders that reuse nothing are counted and
checked alike: their ids and offsets come from the fast tokenizer's backend, which ``encode`` wraps.)

**Keys.** Earlier texts are found by digests of their prefixes at cuts, keyed by a salt (the tenant's cache salt):
one tenant's renders never speed up another's, as with the prefix cache (the time a render takes must not tell
whether another tenant sent a text). Memory is bounded by :data:`BUDGET_TOKENS` ids over the renders kept (least
recently used dropped first).
"""

from __future__ import annotations

import array
import bisect
import hashlib
import logging
import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger(__name__)

BUDGET_TOKENS = 1_000_000  # ids kept over every render held (4 MB as 32-bit ids), least recently used dropped first
CHECK_FIRST = 8  # the first renders of an encoder are all checked against a full encode
CHECK_EVERY = 128  # then one render in this many


@dataclass(eq=False, slots=True)
class _Render:
    ids: array.array  # every id of one rendered text
    digests: list[bytes] = field(default_factory=list)  # its prefix digests in PromptEncoder._at (may be stale)


@dataclass(slots=True)
class EncoderStats:
    renders: int = 0  # texts encoded
    reused: int = 0  # of those, the ones that took ids from an earlier render
    reused_tokens: int = 0  # ids taken from earlier renders
    encoded_tokens: int = 0  # ids the tokenizer produced
    checked: int = 0  # renders compared with a full encode


class CutFinder:
    """Where a tokenizer's cuts lie in a text: its added tokens that split the input before normalization, matched
    leftmost-longest as the tokenizer matches them (``str.find`` per token, C speed), and which matches are cuts."""

    def __init__(self, tokens: Sequence[Any]) -> None:
        by_content = {t.content: t for t in tokens if not t.normalized and t.content}
        self.tokens = [(content, _is_cut(t)) for content, t in by_content.items()]  # every splitting added token

    @classmethod
    def of(cls, tokenizer: Any) -> CutFinder | None:
        """None when ``tokenizer`` is not a fast tokenizer or has no added token that can be a cut."""
        backend = getattr(tokenizer, "backend_tokenizer", None)
        if backend is None:
            return None
        finder = cls(list(backend.get_added_tokens_decoder().values()))
        return finder if any(cut for _, cut in finder.tokens) else None

    def cuts(self, text: str) -> list[int]:
        """Start offsets of the cut tokens the tokenizer would split ``text`` at (offset 0 left out)."""
        matches = []  # (start, -length, is a cut)
        for content, cut in self.tokens:
            at = text.find(content)
            while at >= 0:
                matches.append((at, -len(content), cut))
                at = text.find(content, at + 1)
        matches.sort()
        out, free = [], 0  # free: where the next match may start
        for start, negative, cut in matches:
            if start < free:
                continue  # inside a match taken already (leftmost, then longest, wins)
            free = start - negative
            if cut and start > 0:
                out.append(start)
        return out


def _is_cut(token: Any) -> bool:
    return not (token.lstrip or token.rstrip or token.single_word)


class PromptEncoder:
    """``tokenizer.encode(text, add_special_tokens=False)`` as a list, reusing the ids of earlier texts (see the
    module docstring). Thread-safe."""

    def __init__(self, tokenizer: Any, *, budget_tokens: int = BUDGET_TOKENS, reuse: bool = True) -> None:
        self._tokenizer = tokenizer  # what a full encode uses
        self._backend = getattr(tokenizer, "backend_tokenizer", None)  # ids and offsets of the rest of a text
        self._cuts = CutFinder.of(tokenizer) if reuse else None  # None: reuse off (every encode a full one)
        self.budget_tokens = budget_tokens  # ids kept over the renders held
        self.stats = EncoderStats()
        self._lock = threading.Lock()  # guards everything below and stats
        self._renders: OrderedDict[int, _Render] = OrderedDict()  # by id(), least recently used first
        self._at: dict[bytes, tuple[_Render, int]] = {}  # prefix digest -> a render with that prefix, its ids there
        self._held = 0  # ids over self._renders

    @property
    def reusing(self) -> bool:
        """Whether this encoder reuses ids (False for a tokenizer that is not a fast one, or after a failed check)."""
        return self._cuts is not None

    def full(self, text: str) -> list[int]:
        return list(self._tokenizer.encode(text, add_special_tokens=False))

    def encode(self, text: str, salt: str = "") -> list[int]:
        """The ids of ``text``; ``salt`` keys the earlier texts it may reuse from (one tenant's own)."""
        cuts = self._cuts
        if cuts is None:
            return self.full(text)
        at = cuts.cuts(text)
        digests = _prefix_digests(text, at, salt)
        with self._lock:
            found = self._longest(digests)
        start, prefix = 0, array.array("i")
        if found is not None:
            index, render, count = found
            start, prefix = at[index], render.ids[:count]
        encoding = self._backend.encode(text[start:], add_special_tokens=False)
        ids = prefix + array.array("i", encoding.ids)
        full = self._check(text, ids, found is not None)
        if full is not None:
            return full
        self._remember(ids, at, digests, start, len(prefix), encoding.offsets, found)
        return ids.tolist()

    def _longest(self, digests: list[bytes]) -> tuple[int, _Render, int] | None:
        for index in range(len(digests) - 1, -1, -1):
            hit = self._at.get(digests[index])
            if hit is not None:
                render, count = hit
                self._renders.move_to_end(id(render))
                return index, render, count
        return None

    def _check(self, text: str, ids: array.array, reused: bool) -> list[int] | None:
        """None when ``ids`` stand (compared with a full encode when their turn comes: a render that reused and one
        that did not, whose ids come from the fast tokenizer's backend); else the full encode's ids, and reuse is off
        from now on."""
        with self._lock:
            self.stats.renders += 1
            self.stats.reused += reused
            due = self.stats.renders <= CHECK_FIRST or self.stats.renders % CHECK_EVERY == 0
            if due:
                self.stats.checked += 1
        if not due:
            return None
        full = self.full(text)
        if full == ids.tolist():
            return None
        log.error(
            "a prompt's ids%s differ from a full encode's (%d vs %d ids): render reuse is off for this tokenizer",
            " (reusing an earlier render's)" if reused else "",
            len(ids),
            len(full),
        )
        with self._lock:
            self._cuts = None
            self._renders.clear()
            self._at.clear()
            self._held = 0
        return full

    def _remember(
        self,
        ids: array.array,
        at: list[int],
        digests: list[bytes],
        start: int,
        before: int,
        offsets: Sequence[tuple[int, int]],
        found: tuple[int, _Render, int] | None,
    ) -> None:
        """Hold ``ids`` and point every cut's digest at it: the cuts before ``start`` (reused) keep their counts,
        those after it get the index of the token that starts there (in ``offsets``, relative to ``start``)."""
        render = _Render(ids)
        starts = [s for s, _ in offsets]
        counts: list[tuple[bytes, int]] = []
        for cut, digest in zip(at, digests, strict=True):
            if cut < start:
                continue  # taken below from the render reused
            k = bisect.bisect_left(starts, cut - start)
            if k < len(starts) and starts[k] == cut - start:
                counts.append((digest, before + k))
        with self._lock:
            self.stats.encoded_tokens += len(ids) - before
            self.stats.reused_tokens += before
            if self._cuts is None:
                return
            if found is not None:
                for digest in digests[: found[0]]:
                    old = self._at.get(digest)
                    if old is not None and old[1] <= before:
                        counts.append((digest, old[1]))
            for digest, count in counts:
                self._at[digest] = (render, count)
                render.digests.append(digest)
            self._renders[id(render)] = render
            self._held += len(ids)
            while self._held > self.budget_tokens and len(self._renders) > 1:
                _, dropped = self._renders.popitem(last=False)
                self._held -= len(dropped.ids)
                for digest in dropped.digests:
                    if self._at.get(digest, (None,))[0] is dropped:
                        del self._at[digest]


def _prefix_digests(text: str, at: list[int], salt: str) -> list[bytes]:
    """Per cut, a digest of ``salt`` and ``text`` up to it."""
    h = hashlib.blake2b(salt.encode(), digest_size=16)
    h.update(b"\0")
    out, done = [], 0
    for cut in at:
        h.update(text[done:cut].encode("utf-8", "surrogatepass"))
        done = cut
        out.append(h.copy().digest())
    return out
