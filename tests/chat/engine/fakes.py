"""A weightless model runtime for engine tests: a byte tokenizer and a "model" whose next token is a pure function
of the tokens it has absorbed, so a wrongly restored state shows up as a different reply.

- Tokens 0..255 are bytes; 256 = <|user|>, 257 = <|assistant|>, 258 = <|end|> (EOS), 259 = <|system|>.
- The reply to a prompt spells ``script`` (a function of the prompt) and then <|end|>.
- ``kind="normal"`` exports the absorbed tokens as a full-attention layer; ``kind="recurrent"`` as snapshots only,
  which makes the engine's snapshot boundaries matter.
- ``forward_batch`` runs each feed through ``forward`` (override that to inject faults); a feed whose tokens
  include ``poison`` fails alone, as the real adapter isolates a failing feed.
- ``drift=True`` renders a finished assistant turn without its first ``<think>...</think>`` block, as many chat
  templates do, so the next prompt differs from the generated tokens.
"""

from __future__ import annotations

import codecs
import re
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

from cache import Lease, NormalKV, RecurrentState
from chat.engine.runtime import StepInterrupted

USER, ASSISTANT, END, SYSTEM = 256, 257, 258, 259
VOCAB = 260
MAX_LEN = 4096
ROLE = {"user": USER, "assistant": ASSISTANT, "system": SYSTEM, "tool": USER}  # tool results as user turns


def default_script(prompt: Sequence[int]) -> str:
    return f"reply {sum(prompt) % 997} ünï"  # non-ASCII: multi-byte UTF-8 across tokens


@dataclass
class FakeRun:
    tokens: list[int]
    snapshots: dict[int, tuple[torch.Tensor, ...]] = field(default_factory=dict)

    @property
    def length(self) -> int:
        return len(self.tokens)


class ByteDetokenizer:
    def __init__(self) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")("replace")

    def push(self, token_id: int) -> str:
        return self._decoder.decode(bytes([token_id])) if token_id < 256 else ""

    def flush(self) -> str:
        return self._decoder.decode(b"", final=True)


@dataclass(frozen=True)
class FakePrompt:
    tokens: tuple[int, ...]
    spans: tuple = ()


class _ByteTokens:
    """The fake vocabulary as llguidance reads a tokenizer: bytes 0..255, then four special tokens."""

    eos_token_id = END
    bos_token_id = None
    tokens = (*(bytes([i]) for i in range(256)), b"<|user|>", b"<|assistant|>", b"<|end|>", b"<|system|>")
    special_token_ids = (USER, ASSISTANT, END, SYSTEM)

    def __call__(self, text: bytes) -> list[int]:
        return list(text)


_TABLE = None  # the fake's llguidance tokenizer, built once


class FakeRuntime:
    name = "fake"
    dtype = "float32"
    weights = "float32"
    eos_token_ids = frozenset({END})
    modalities: frozenset[str] = frozenset()
    vocab_size = VOCAB
    generation_defaults: dict = {}  # noqa: RUF012 (read only)

    def constraint_tokenizer(self):
        global _TABLE
        if _TABLE is None:
            import llguidance

            _TABLE = llguidance.LLTokenizer(llguidance.TokenizerWrapper(_ByteTokens()), n_vocab=VOCAB)
        return _TABLE

    def encode(self, text: str) -> list[int]:
        return list(text.encode())

    def decode(self, token_ids) -> str:
        return bytes(t for t in token_ids if t < 256).decode(errors="replace")

    def token_bytes(self, token_id: int) -> bytes:
        return _ByteTokens.tokens[token_id] if 0 <= token_id < VOCAB else b""

    def __init__(
        self,
        kind: str = "normal",
        *,
        script: Callable[[Sequence[int]], str] = default_script,
        drift: bool = False,
        context_window: int = MAX_LEN,
        delay_s: float = 0.0,
    ) -> None:
        self.kind = kind
        self.fingerprint = f"fake-{kind}"
        self.has_recurrent_state = kind == "recurrent"
        self.whole_media_spans = False  # its media items are causal like text
        self.context_window = context_window
        self.script = script
        self.drift = drift
        self.forwarded = 0  # tokens run through forward(), to check that hits skip work
        self.open_runs = 0  # runs not yet closed
        self.delay_s = delay_s  # sleep per forward_batch call, to make a long reply take real time
        self.batches: list[int] = []  # feeds per forward_batch call
        self.poison: int | None = None  # a feed holding this token fails (and only that feed)
        self.can_rewind = False  # True: rewind() works (then greedy replies speculate)
        self.layers = 4  # a forward_batch asks its interrupt before layers 1..3 (its delay_s spread over the four)
        self.interrupted = 0  # forward_batch calls stopped by their interrupt
        self.entered = threading.Event()  # set as a forward_batch call begins
        self.gate: threading.Event | None = None  # if set: every forward_batch call waits for it before its layers

    def render(self, messages, add_generation_prompt: bool = True) -> list[int]:
        out: list[int] = []
        for m in messages:
            content = m["content"]
            if self.drift and m["role"] == "assistant":
                content = re.sub(r"<think>.*?</think>", "", content, count=1, flags=re.S)
            out += [ROLE[m["role"]], *content.encode(), END]
        if add_generation_prompt:
            out.append(ASSISTANT)
        return out

    def render_prompt(self, messages) -> FakePrompt:
        return FakePrompt(tuple(self.render(messages)))

    def detokenizer(self) -> ByteDetokenizer:
        return ByteDetokenizer()

    def new_run(self, lease: Lease | None = None, prompt: FakePrompt | None = None) -> FakeRun:
        self.open_runs += 1
        if lease is None:
            return FakeRun([])
        layer = lease.layers[0]
        if self.kind == "normal":
            tokens = [int(x) for x in layer.keys[0, 0, :, 0].tolist()]
        else:
            state = layer.tensors[0]
            tokens = [int(x) for x in state[0, : int(state[0, -1])].tolist()]
        assert len(tokens) == lease.length
        run = FakeRun(tokens)
        inherited = lease.snapshots_upto[0]
        if inherited:
            run.snapshots.update(inherited)
        return run

    def _next_token(self, tokens: Sequence[int]) -> int:
        start = max(i for i, t in enumerate(tokens) if t == ASSISTANT) if ASSISTANT in tokens else len(tokens)
        written = tokens[start + 1 :]
        reply = self.script(tokens[: start + 1]).encode()
        return reply[len(written)] if len(written) < len(reply) else END

    def forward(self, run: FakeRun, token_ids: Sequence[int], *, last_only: bool = False) -> torch.Tensor:
        logits = torch.zeros(len(token_ids), VOCAB)
        for i, t in enumerate(token_ids):
            run.tokens.append(int(t))
            logits[i, self._next_token(run.tokens)] = 100.0  # sampled at temperature 1 too
        self.forwarded += len(token_ids)
        return logits[-1:] if last_only else logits

    def forward_batch(self, feeds, interrupt=None) -> list:
        self.batches.append(len(feeds))
        self.entered.set()
        if self.gate is not None:
            self.gate.wait(10)
        for layer in range(self.layers):  # nothing is computed before the last layer: nothing to roll back
            if layer and interrupt is not None and interrupt():
                self.interrupted += 1
                raise StepInterrupted(f"stopped before layer {layer}")
            if self.delay_s:
                time.sleep(self.delay_s / self.layers)
        out: list = []
        for feed in feeds:
            try:
                if self.poison is not None and self.poison in feed.tokens:
                    raise RuntimeError("poisoned feed")
                logits = self.forward(feed.run, feed.tokens)
                out.append(logits[len(logits) - feed.logits :] if feed.logits else None)
            except Exception as exc:
                out.append(exc)
        return out

    def rewind(self, run: FakeRun, n: int) -> None:
        assert self.can_rewind and 0 <= n <= run.length
        del run.tokens[len(run.tokens) - n :]

    def extras(self, run: FakeRun) -> tuple:
        return ()

    def _state(self, tokens: list[int]) -> torch.Tensor:
        state = torch.zeros(1, MAX_LEN + 1)
        state[0, : len(tokens)] = torch.tensor(tokens, dtype=torch.float32)
        state[0, -1] = len(tokens)
        return state

    def snapshot(self, run: FakeRun) -> None:
        run.snapshots[run.length] = (self._state(run.tokens),)

    def export(self, run: FakeRun):
        if self.kind == "normal":
            t = torch.tensor(run.tokens, dtype=torch.float32).view(1, 1, -1, 1)
            return [NormalKV(t, t.clone())]
        return [RecurrentState(dict(run.snapshots))]

    def close_run(self, run: FakeRun) -> None:
        self.open_runs -= 1


class FakeMediaRuntime(FakeRuntime):
    """A FakeRuntime that takes images, audio and video: each item is decoded with :mod:`modalities` (so corrupt or
    oversized media fail the turn, naming the item) and rendered as :data:`MEDIA_TOKENS` placeholder bytes covered by
    a media span keyed by the sha256 of its bytes."""

    MEDIA_TOKENS = 8
    modalities = frozenset({"image", "audio", "video"})

    def render_prompt(self, messages) -> FakePrompt:
        from cache import MediaSpan
        from modalities import audio, image, video
        from modalities.parts import MediaInput

        decoders = {"image": image.decode, "audio": audio.decode, "video": video.decode}
        tokens: list[int] = []
        spans = []
        for m in messages:
            tokens.append(ROLE[m["role"]])
            parts = m["content"] if isinstance(m["content"], list) else [{"type": "text", "text": m["content"]}]
            for part in parts:
                if isinstance(part, MediaInput):
                    decoders[part.kind](part.data, declared=part.declared, item=part.item)
                    start = len(tokens)
                    tokens += [ord("#")] * self.MEDIA_TOKENS
                    spans.append(MediaSpan(start, len(tokens), part.kind, part.digest))
                else:
                    tokens += part["text"].encode()
            tokens.append(END)
        tokens.append(ASSISTANT)
        return FakePrompt(tuple(tokens), tuple(spans))
