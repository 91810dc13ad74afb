"""Constrained decoding: replies that must match a JSON schema, any JSON object, a regular expression, a grammar or
one of a list of strings, through llguidance.

Why llguidance (measured here, 2026-11-24, AMD EPYC, the built-in model's 49,152-token vocabulary, a 6-property
schema with a nested object, a pattern and an array): it compiles a schema in ~1 ms (first use 2.4 ms) and fills a
mask in 14 us at the median (xgrammar: ~1 ms / 2.6 us, but it requires triton, a torch floor and transformers of its
own choosing; outlines-core: 42 ms to build the index, regular expressions only, no recursive schemas or grammars).
Masks of ~10-20 us per turn are under 0.2% of a decode step. llguidance takes JSON Schema, Lark grammars (GBNF is
converted), regular expressions, needs nothing but itself, and computes the masks of a whole batch in Rust threads
without the GIL (:class:`MaskBatch`).

The pieces::

    spec = GrammarSpec("json_schema", canonical_json(schema), strict=True)   # what a request asks for (pure data)
    compiled = compiler.compile(spec)        # GrammarCompiler: LRU by spec digest; raises GrammarError
    constraint = Constraint(compiled)        # one reply's parser state (a copy of the compiled matcher)
    constraint.mask(scores)                  # forbidden tokens -> -inf (the mask is computed ahead when batched)
    constraint.accept(token)                 # advance; .finished once the grammar cannot go on

A grammar that allows the reply to end lets the model's end-of-sequence token through; once it cannot go on, the
turn ends ("stop") without waiting for one. A reply cut by ``max_tokens`` ends where it was cut ("length").

Limits: a grammar's source is at most :data:`MAX_GRAMMAR_CHARS` characters (the wire refuses longer ones), and
llguidance's parser limits (:data:`PARSER_LIMITS`: lexer states, grammar size, work per token) refuse a grammar whose
compile or masks would take too long or too much memory, with an error instead of a hang.
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Literal

import llguidance
import llguidance.numpy as llg_numpy
import torch

from chat.engine.errors import EngineError

_log = logging.getLogger(__name__)
GrammarKind = Literal["json_object", "json_schema", "regex", "grammar", "choice"]
MAX_GRAMMAR_CHARS = 65_536  # a schema's canonical JSON, a regex, a grammar, or the choices' JSON
MAX_CHOICES = 1_024  # strings in a `choice` constraint
COMPILED_CAPACITY = 256  # compiled grammars kept (least recently used dropped first)
PARSER_LIMITS = dict(  # llguidance's budgets: ~250 ms of lexer work at compile, ~15 ms per token at most
    initial_lexer_fuel=10_000_000,
    step_lexer_fuel=200_000,
    step_max_items=50_000,
    max_lexer_states=100_000,  # ~1-2 kB each
    max_grammar_size=200_000,
    verbose_errors=False,  # errors go to clients: no parser dumps
)
JSON_OPTIONS = {"whitespace_flexible": False}  # compact JSON: no run of spaces a small model can loop in


class GrammarError(EngineError, ValueError):
    """A grammar that cannot be used: not valid JSON Schema, a regex or grammar that does not compile, or over a
    limit. The message says what is wrong in words a user can act on. (An EngineError: a cluster's replica reports
    it to the ingress as the engine's refusal of a turn.)"""


class ConstraintError(RuntimeError):
    """A reply left its grammar (a sampled token the mask should have forbidden): a bug, never a user error."""


@dataclass(frozen=True, slots=True)
class GrammarSpec:
    """What a reply must match (pure data: requests carry it, replicas compile it)."""

    kind: GrammarKind
    source: str = ""  # json_schema: the schema as canonical JSON; regex; grammar (Lark or GBNF); choice: a JSON list
    strict: bool = True  # json_schema: refuse keywords the compiler does not implement (False: ignore them)

    @property
    def digest(self) -> str:
        """What compiled grammars are cached by."""
        return hashlib.sha256(f"{self.kind}\0{int(self.strict)}\0{self.source}".encode()).hexdigest()


def canonical_json(value: Any) -> str:
    """``value`` as compact JSON: the same schema sent with other spacing gives the same digest. Keys keep their
    order: a schema's property order is the order the reply writes them in."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def check_json_schema(schema: Any) -> None:
    """Raises GrammarError: ``schema`` is not a JSON Schema (by its own ``$schema`` draft, else 2020-12)."""
    import jsonschema

    if not isinstance(schema, dict | bool):
        raise GrammarError("a JSON schema must be an object")
    try:
        jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator).check_schema(schema)
    except jsonschema.SchemaError as exc:
        where = "/".join(str(p) for p in exc.absolute_path)
        raise GrammarError(f"not a valid JSON Schema{f' at {where}' if where else ''}: {exc.message}") from None


def _lark_of(spec: GrammarSpec) -> str:
    """The llguidance grammar text of ``spec``. Raises GrammarError."""
    if len(spec.source) > MAX_GRAMMAR_CHARS:
        raise GrammarError(f"the grammar is over {MAX_GRAMMAR_CHARS} characters")
    if spec.kind == "json_object":
        return llguidance.LLMatcher.grammar_from_json_schema({"type": "object"}, defaults=JSON_OPTIONS)
    if spec.kind == "json_schema":
        schema = json.loads(spec.source)
        check_json_schema(schema)
        options = {**JSON_OPTIONS, "lenient": not spec.strict}
        try:
            return llguidance.LLMatcher.grammar_from_json_schema(schema, defaults=options)
        except ValueError as exc:
            raise GrammarError(str(exc)) from None
    if spec.kind == "regex":
        return llguidance.LLMatcher.grammar_from_regex(spec.source)
    if spec.kind == "grammar":
        text = spec.source
        if "::=" in text:  # GBNF (llama.cpp's grammars)
            try:
                text = llguidance.gbnf_to_lark(text)
            except Exception as exc:
                raise GrammarError(f"the GBNF grammar does not convert: {exc}") from None
        return llguidance.LLMatcher.grammar_from_lark(text)
    if spec.kind == "choice":
        choices = json.loads(spec.source)
        if not choices or len(choices) > MAX_CHOICES or not all(isinstance(c, str) and c for c in choices):
            raise GrammarError(f"choice takes 1 to {MAX_CHOICES} non-empty strings")
        return llguidance.LLMatcher.grammar_from_lark("start: " + " | ".join(json.dumps(c) for c in choices))
    raise GrammarError(f"unknown grammar kind {spec.kind!r}")


@dataclass(frozen=True, slots=True)
class CompiledGrammar:
    """A grammar compiled for one tokenizer: the matcher every reply's :class:`Constraint` copies."""

    spec: GrammarSpec
    matcher: Any  # llguidance.LLMatcher in its initial state (never advanced)
    vocab_size: int  # mask width: the logits' width
    compile_ms: float = 0.0  # how long the compile took


class GrammarCompiler:
    """Compiles grammar specs for one tokenizer and keeps the last :data:`COMPILED_CAPACITY` by digest. Thread-safe
    (the server validates requests with it; the engine's worker compiles what it runs)."""

    def __init__(self, tokenizer: Any, *, capacity: int = COMPILED_CAPACITY) -> None:
        self.tokenizer = tokenizer  # llguidance.LLTokenizer covering every logit (n_vocab = the logits' width)
        self.vocab_size = int(tokenizer.vocab_size)  # mask width
        self.capacity = capacity
        self.compiles = 0  # grammars compiled (cache misses)
        self.hits = 0  # specs found compiled
        self._compiled: OrderedDict[str, CompiledGrammar] = OrderedDict()
        self._lock = threading.Lock()
        self._limits = llguidance.LLParserLimits(**PARSER_LIMITS)

    def compile(self, spec: GrammarSpec) -> CompiledGrammar:
        """The compiled form of ``spec`` (from the cache when it was compiled before).

        Raises:
            GrammarError: the spec does not compile, or is over a limit.
        """
        key = spec.digest
        with self._lock:
            found = self._compiled.get(key)
            if found is not None:
                self._compiled.move_to_end(key)
                self.hits += 1
                return found
        start = time.perf_counter()
        text = _lark_of(spec)
        matcher = llguidance.LLMatcher(self.tokenizer, text, log_level=0, limits=self._limits)  # drops the GIL
        if matcher.is_error():
            raise GrammarError(_clean(matcher.get_error()))
        compiled = CompiledGrammar(spec, matcher, self.vocab_size, (time.perf_counter() - start) * 1e3)
        with self._lock:
            self.compiles += 1
            self._compiled[key] = compiled
            while len(self._compiled) > self.capacity:
                self._compiled.popitem(last=False)
        return compiled


def _clean(message: str) -> str:
    """llguidance's error without its internal state dump."""
    return message.split("\n<state>")[0].strip() or "the grammar does not compile"


class Constraint:
    """One reply's place in its grammar. Not thread-safe (the engine's worker drives it; a :class:`MaskBatch` may
    fill its mask in another thread while the worker waits for the forward)."""

    def __init__(self, compiled: CompiledGrammar) -> None:
        self.spec = compiled.spec
        self.vocab_size = compiled.vocab_size  # mask width
        self._matcher = compiled.matcher.deep_copy()  # advanced token by token
        self._bitmask: torch.Tensor | None = None  # [1, words] int32: the mask of the current state, when set

    @property
    def finished(self) -> bool:
        """The grammar cannot take another token: the reply is complete."""
        return self._matcher.is_stopped()

    def mask(self, scores: torch.Tensor) -> torch.Tensor:
        """``scores`` [vocab] with every token the grammar forbids next set to -inf (in place).

        Raises:
            ConstraintError: the parser is in an error state (a limit was hit mid-reply).
        """
        if self._bitmask is None:
            self._bitmask = torch.from_numpy(llg_numpy.allocate_token_bitmask(1, self.vocab_size))
            llg_numpy.fill_next_token_bitmask(self._matcher, self._bitmask.numpy(), 0)
        if self._matcher.is_error():
            raise ConstraintError(_clean(self._matcher.get_error()))
        apply_bitmask(scores.view(1, -1), self._bitmask)
        return scores

    @property
    def needs_mask(self) -> bool:
        """The mask of the current state is not computed yet."""
        return self._bitmask is None

    def parser(self) -> Any:
        """The llguidance matcher (for :class:`MaskBatch`, which fills masks outside this object)."""
        return self._matcher

    def use_mask(self, bitmask: torch.Tensor) -> None:
        """``bitmask`` [1, words] holds the mask of the current state (filled by a MaskBatch)."""
        self._bitmask = bitmask

    def accept(self, token: int) -> None:
        """``token`` was picked. Raises ConstraintError if the grammar forbids it."""
        self._bitmask = None
        if not self._matcher.consume_token(token):
            raise ConstraintError(_clean(self._matcher.get_error()))


_BIT_SHIFTS = torch.arange(32, dtype=torch.int32)  # bit k of a mask word is token 32 * word + k


def apply_bitmask(scores: torch.Tensor, bitmask: torch.Tensor) -> None:
    """Set to -inf, in place, every score of ``scores`` [batch, vocab] whose bit in ``bitmask`` [batch, words] is 0
    (int32 words, llguidance's layout: token t is bit t % 32 of word t // 32); tokens past the mask's 32 * words are
    forbidden too. Written here rather than taken from ``llguidance.torch``, whose version is a ``torch.compile``d
    kernel: importing it loads torch's compiler (~1.9 s in every serving process) and its first call compiles
    (~1.5 s on a server's first constrained turn), for these few vector operations."""
    batch, vocab = scores.shape
    allowed = ((bitmask.unsqueeze(-1) >> _BIT_SHIFTS) & 1).view(batch, -1)  # [batch, 32 * words]
    covered = min(vocab, allowed.shape[1])
    scores[:, :covered].masked_fill_(allowed[:, :covered] == 0, float("-inf"))
    scores[:, covered:] = float("-inf")


class MaskBatch:
    """Fills the masks of many constraints at once, in llguidance's Rust threads, while the caller does something
    else (the forward of the step those masks are for)::

        pending = masks.start(constraints)      # before the forward
        ... forward ...
        masks.wait(pending)                     # each constraint's mask is ready (Constraint.mask uses it)
    """

    def __init__(self, threads: int = 1) -> None:
        self._executor = llguidance.LLExecutor(num_threads=threads)  # Rust threads that compute masks
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="turncache-masks")  # releases the caller

    def start(self, constraints: Sequence[Constraint]) -> Future | None:
        todo = [c for c in constraints if c.needs_mask]
        if not todo:
            return None
        return self._pool.submit(self._fill, todo)

    def wait(self, pending: Future | None) -> None:
        """Until the masks of ``pending`` are filled. A fill that failed is logged; those constraints compute their
        mask themselves when it is used."""
        if pending is None:
            return
        try:
            pending.result()
        except Exception:
            _log.warning("grammar masks could not be filled ahead; they are computed when used", exc_info=True)

    def _fill(self, constraints: list[Constraint]) -> None:
        words = llg_numpy.get_bitmask_shape(1, constraints[0].vocab_size)[1]
        bitmask = torch.empty((len(constraints), words), dtype=torch.int32)
        parsers = [(c.parser(), i) for i, c in enumerate(constraints)]
        llg_numpy.fill_next_token_bitmask_par(self._executor, parsers, bitmask.numpy())
        for i, c in enumerate(constraints):
            c.use_mask(bitmask[i : i + 1])

    def close(self) -> None:
        self._pool.shutdown(wait=False)
