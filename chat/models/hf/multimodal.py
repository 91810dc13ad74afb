"""Multimodal models (images, audio, video) behind the same runtime interface as text models.

One turn::

    prompt = model.render_prompt(messages)       # media hashed, decoded and preprocessed once (media store),
                                                 # placeholders expanded to each item's token count
    match = cache.lookup(ns, prompt.tokens, prompt.spans)
    run = model.new_run(lease, prompt)           # plans the positions of everything after the prefix
    logits = model.forward(run, prompt.tokens[n:])   # items after the prefix are encoded when first reached
    cache.insert(ns, tokens, model.export(run), media=spans, extras=model.extras(run))

Only items that lie after the restored prefix are ever encoded, and an item encoded in an earlier turn is taken from
the media store (stage ``"encoded:<model fingerprint>"``) instead of running the encoder again. Items arrive as
:class:`modalities.parts.MediaInput` s carrying the digest of their bytes, so rendering an earlier item neither
decodes nor hashes it. A Qwen2.5-Omni video with its audio track is one item of several token runs
(:attr:`PreparedMedia.runs`): one cache span from ``<vision_bos>`` to ``<vision_eos>``, its rows the two encoders'
outputs interleaved between the markers' embeddings.

The language model runs on ``inputs_embeds``: text embeddings with the encoder's rows written over each item's
placeholder tokens, so a prefill may start or stop anywhere (a cached prefix never ends inside an item). Qwen-family
models take 3-D mRoPE position ids (:mod:`chat.models.hf.mrope`): the positions of the suffix continue from the next
position id stored with the cache entry (the entry's extras hold ``next position - length`` after each item), never
from the prefix's tokens. LLaVA-style models use plain 1-D positions.

Qwen3-VL adds *deepstack* features: its vision tower also returns, per item, one set of rows for each of the first
few decoder layers, added to those layers' outputs at the item's placeholder positions. They are cached with the
item's rows (:class:`EncodedItem`), and each forward takes those of its own tokens only (``visual_pos_masks``: which
of the tokens are placeholders inside an item, ``deepstack_visual_embeds``: their rows, in token order), so a prefill
cut anywhere, or packed with other runs, adds exactly what the whole prompt's forward adds. Its videos are written
frame group by frame group with timestamps (:class:`chat.models.hf.media_prep.TimestampedVideoPreparer`): one item, each
group placed like an image (:attr:`PreparedMedia.frame_starts`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import torch

from cache import Lease, MediaSpan
from chat.models.adapter import RunState
from chat.models.chat_template import render_text
from chat.models.errors import RunStateError
from chat.models.hf.families_mm import AUDIO_IN_VIDEO_MARKERS, MultimodalFamily
from chat.models.hf.media_prep import PreparedMedia
from chat.models.hf.runtime import TransformersAdapter
from modalities.errors import MediaError
from modalities.identity import content_hash
from modalities.parts import MediaInput
from modalities.store import MediaStore

MEDIA_STORE_BYTES = 512 * 1024 * 1024  # prepared inputs and encoder outputs kept for repeats
PREPARED = "prepared"  # media store stage of a PreparedMedia


@dataclass(frozen=True, slots=True, eq=False)
class PromptItem:
    span: MediaSpan  # token positions, kind and content hash
    prepared: PreparedMedia = field(repr=False)  # the encoder's inputs
    item: str  # where it came from


@dataclass(frozen=True, slots=True, eq=False)
class MediaPrompt:
    tokens: tuple[int, ...]  # the prompt with every placeholder expanded to its item's token count
    items: tuple[PromptItem, ...]  # in prompt order

    @property
    def spans(self) -> tuple[MediaSpan, ...]:
        return tuple(it.span for it in self.items)


@dataclass(frozen=True, slots=True, eq=False)
class EncodedItem:
    """What one item's span is embedded as: the media store's ``encoded:<fingerprint>`` value."""

    kind: str  # "image" | "audio" | "video": the item's kind (a video with its audio track is a "video")
    rows: torch.Tensor  # [span, hidden]: written over the span's token embeddings
    deepstack: torch.Tensor | None = None  # [layers, span, hidden]: added to the outputs of the first decoder layers
    # at the span's placeholder positions (zeros elsewhere); None for families without deepstack features

    @property
    def nbytes(self) -> int:
        """Bytes of its tensors' elements (rows and deepstack rows): what the media store charges for it."""
        extra = 0 if self.deepstack is None else self.deepstack.numel() * self.deepstack.element_size()
        return self.rows.numel() * self.rows.element_size() + extra


@dataclass(frozen=True, slots=True)
class HeldMedia:
    """One item's encoder output held in a model's media store (:meth:`MultimodalAdapter.held_media`)."""

    content_hash: str  # the item's identity (its bytes and preparation settings)
    kind: str  # "image" | "audio" | "video"
    encoded_bytes: int  # EncodedItem.nbytes: its rows plus its deepstack rows (Qwen3-VL), if any
    prepared_bytes: int  # its encoder inputs (PreparedMedia.nbytes) if still held too, else 0


@dataclass(slots=True, eq=False)
class RunMedia:
    """A run's media and position plan (``RunState.media``)."""

    items: tuple[PromptItem, ...]  # prompt items after the restored prefix
    base: int  # the run's length when planned (the restored prefix)
    positions: torch.Tensor | None  # [3, prompt_end - base] mRoPE positions of the rest of the prompt
    delta: int  # next position id minus length, after the prompt (decoded tokens continue with it)
    steps: list[tuple[int, int]]  # (length, delta) after the start and after each item: the entries' extras
    features: dict[str, EncodedItem] = field(default_factory=dict)  # content hash -> rows, while the run needs them
    encoded: int = 0  # items this run had to encode
    reused: int = 0  # items this run took from the media store instead


class TextStack(torch.nn.Module):
    """The language model and output head of a multimodal model, called like a causal LM on ``inputs_embeds``."""

    def __init__(self, language_model: Any, lm_head: Any, config: Any) -> None:
        super().__init__()
        self.language_model = language_model
        self.lm_head = lm_head
        self.config = config  # the text config: what the cache layout is built from

    def get_input_embeddings(self) -> Any:
        return self.language_model.get_input_embeddings()

    def get_output_embeddings(self) -> Any:
        return self.lm_head

    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        past_key_values: Any = None,
        use_cache: bool = True,
        logits_to_keep: int | torch.Tensor = 0,
        visual_pos_masks: torch.Tensor | None = None,
        deepstack_visual_embeds: torch.Tensor | None = None,
    ) -> Any:
        """``visual_pos_masks`` ``[1, q]`` and ``deepstack_visual_embeds`` ``[layers, visual, hidden]`` (Qwen3-VL):
        the placeholder positions among the tokens and their deepstack rows, in token order."""
        extra: dict[str, Any] = {}
        if visual_pos_masks is not None and deepstack_visual_embeds is not None and bool(visual_pos_masks.any()):
            extra = {"visual_pos_masks": visual_pos_masks, "deepstack_visual_embeds": list(deepstack_visual_embeds)}
        out = self.language_model(
            input_ids=input_ids,
            inputs_embeds=inputs_embeds,
            position_ids=position_ids,
            past_key_values=past_key_values,
            use_cache=use_cache,
            **extra,
        )
        hidden = out.last_hidden_state
        if isinstance(logits_to_keep, torch.Tensor):  # positions to keep
            hidden = hidden[:, logits_to_keep]
        elif logits_to_keep:  # that many last positions
            hidden = hidden[:, -logits_to_keep:]
        return SimpleNamespace(logits=self.lm_head(hidden))


class MultimodalAdapter(TransformersAdapter):
    """A :class:`~chat.models.hf.runtime.TransformersAdapter` whose prompts may hold media. Build with
    :func:`chat.models.load_model`."""

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        family: MultimodalFamily,
        *,
        media_store_bytes: int = MEDIA_STORE_BYTES,
        **kwargs: Any,
    ) -> None:
        inner = model.model
        language_model = inner.language_model if hasattr(inner, "language_model") else inner.text_model  # SmolVLM
        stack = TextStack(language_model, model.lm_head, model.config.get_text_config(decoder=True))
        super().__init__(stack.eval(), tokenizer, **kwargs)
        self.tool_format = "generic"  # its render_prompt places media; tools go in the system message
        self.reasoning = None  # its render_prompt takes no template variables: thinking is not split off
        self._full = model  # the whole HF model: its encoders run on media
        self.family = family
        self.modalities = frozenset(family.preparers)  # kinds this model takes
        self.whole_media_spans = family.bidirectional  # a prefill chunk never cuts an item
        self.media_store = MediaStore(media_store_bytes)  # prepared inputs and encoder outputs by content hash
        self._embed = stack.get_input_embeddings()
        self._kind_of = {token: kind for kind, token in family.placeholders.items()}
        self._placeholder_ids = torch.tensor(sorted(self._kind_of), device=self.device)  # every kind's placeholder
        self.media_counters = {"items": 0, "encoded": 0, "encoder_skipped": 0}  # over all runs (benchmarks)

    def held_media(self) -> tuple[HeldMedia, ...]:
        """Every item whose encoder output this model's media store holds now, least recently used first, with its
        sizes (for reports on memory; nothing is marked as used or counted)."""
        stage = self._encoded_stage
        held = []
        for key, kept in self.media_store.lru_keys():
            if kept != stage:
                continue
            encoded = self.media_store.peek(key, stage)
            if encoded is None:  # evicted since the keys were listed
                continue
            prepared = self.media_store.peek(key, PREPARED)
            held.append(HeldMedia(key, encoded.kind, encoded.nbytes, 0 if prepared is None else prepared.nbytes))
        return tuple(held)

    @property
    def _encoded_stage(self) -> str:
        """The media store's stage of this model's encoder outputs."""
        return f"encoded:{self.fingerprint}"

    @property
    def full_model(self) -> Any:
        """The transformers model (for reference forwards in tests and benchmarks)."""
        return self._full

    # ================================================================ prompts

    def render_prompt(self, messages: Sequence[Mapping[str, Any]], *, salt: str = "") -> MediaPrompt:
        """The prompt of ``messages`` whose content is a string or a list of ``{"type": "text", "text"}`` dicts and
        :class:`~modalities.parts.MediaInput` s, through the chat template, with each item's placeholder expanded.
        The rendered text's ids reuse those of earlier renders with the same ``salt``
        (:mod:`chat.models.prompt_tokens`).

        Raises:
            MediaError: an item is corrupt, mislabeled, over a limit, or of a kind this model does not take (its
                ``item`` names it); or the placeholders in the rendered text do not match the media parts (e.g.
                the user's text contains a placeholder token).
        """
        template_messages: list[dict[str, Any]] = []
        parts: list[MediaInput] = []
        for i, message in enumerate(messages):
            content = message.get("content")
            if isinstance(content, str):
                template_messages.append({"role": message["role"], "content": content})
                continue
            pieces: list[dict[str, Any]] = []
            for j, part in enumerate(content or ()):
                if isinstance(part, MediaInput):
                    if part.kind not in self.modalities:
                        raise MediaError(f"{self.name} does not take {part.kind} input", item=part.item)
                    parts.append(part)
                    pieces.append({"type": part.kind})
                elif isinstance(part, Mapping) and part.get("type") == "text":
                    pieces.append({"type": "text", "text": str(part.get("text", ""))})
                else:
                    raise MediaError("unknown content part", item=f"messages[{i}].content[{j}]")
            template_messages.append({"role": message["role"], "content": pieces})
        prepared = self._prepare_all(parts)  # decode errors surface here, before any compute
        text = render_text(self._tokenizer, template_messages, model=self.name)
        for written, meant in self.family.template_text.items():
            text = text.replace(written, meant)
        ids = self.prompt_encoder.encode(text, salt)
        rendered = self._expand(ids, parts, prepared)
        for key, value in prepared:  # only a prompt that renders leaves its items in the store
            if not self.media_store.contains(key, PREPARED):
                self.media_store.put(key, value, value.nbytes, PREPARED)
        return rendered

    def _prepare_all(self, parts: Sequence[MediaInput]) -> list[tuple[str, PreparedMedia]]:
        """(content hash, prepared item) per part: from the media store, or decoded and preprocessed (each
        distinct item once per call). Nothing is stored here."""
        out: list[tuple[str, PreparedMedia]] = []
        fresh: dict[str, PreparedMedia] = {}
        for part in parts:
            preparer = self.family.preparers[part.kind]
            key = content_hash(part.digest, preparer.fingerprint)  # the digest came with the item: no hashing
            value = fresh.get(key) or self.media_store.get(key, PREPARED)
            if value is None:
                value = fresh[key] = preparer.prepare(part.data, part.declared, part.item)
            out.append((key, value))
        return out

    def _expand(
        self, ids: list[int], parts: list[MediaInput], prepared: list[tuple[str, PreparedMedia]]
    ) -> MediaPrompt:
        found = [(at, self._kind_of[t]) for at, t in enumerate(ids) if t in self._kind_of]
        if len(found) != len(parts) or any(kind != part.kind for (_, kind), part in zip(found, parts, strict=False)):
            kinds = ", ".join(kind for _, kind in found) or "none"
            sent = ", ".join(p.kind for p in parts) or "none"
            raise MediaError(
                f"the rendered prompt has media placeholders ({kinds}) that do not match the media sent ({sent}); "
                "message text must not contain the model's placeholder tokens",
                item="messages",
            )
        tokens: list[int] = []
        items: list[PromptItem] = []
        cursor = 0
        for (at, kind), part, (key, prep) in zip(found, parts, prepared, strict=True):
            tokens.extend(ids[cursor:at])
            start = len(tokens)
            if prep.runs:  # a video with its audio: one item, its span from <vision_bos> to <vision_eos>
                tokens.extend(self._interleaved_tokens(ids, at, prep, part.item))
                start, end = start - 1, len(tokens) + 1
            elif prep.layout:  # tiles with their markers (SmolVLM): the span is the whole layout
                tokens.extend(prep.layout)
                end = len(tokens)
            else:
                tokens.extend([ids[at]] * prep.tokens)
                end = len(tokens)
            items.append(PromptItem(MediaSpan(start, end, kind, key), prep, part.item))
            cursor = at + 1
        tokens.extend(ids[cursor:])
        return MediaPrompt(tuple(tokens), tuple(items))

    def _interleaved_tokens(self, ids: list[int], at: int, prep: PreparedMedia, item: str) -> list[int]:
        """What replaces the video placeholder at ``ids[at]`` for a video with its audio: ``<audio_bos>``, the video
        and audio placeholder runs, ``<audio_eos>``; the template's vision markers must frame it.

        Raises:
            MediaError: the chat template does not put the vision markers around the placeholder.
        """
        marks = self.family.markers
        if not (0 < at < len(ids) - 1 and ids[at - 1] == marks["vision_start"] and ids[at + 1] == marks["vision_end"]):
            raise MediaError(
                "the chat template does not frame the video with its vision markers, so its audio cannot be used",
                item=item,
            )
        placeholder = {"video": self.family.placeholders["video"], "audio": self.family.placeholders["audio"]}
        out = [marks["audio_start"]]
        for kind, count in prep.runs:
            out += [placeholder[kind]] * count
        out.append(marks["audio_end"])
        return out

    # ================================================================ runs

    def new_run(self, lease: Lease | None = None, prompt: MediaPrompt | None = None) -> RunState:
        """A run holding ``lease``'s state, planned to prefill the rest of ``prompt`` (text-only if None).

        Raises:
            RunStateError: the lease does not fit the model, or ends inside a media item of the prompt.
        """
        run = super().new_run(lease)
        base = run.length
        tokens = prompt.tokens if prompt is not None else ()
        items = tuple(it for it in (prompt.items if prompt is not None else ()) if it.span.end > base)
        if any(it.span.start < base for it in items):
            raise RunStateError(f"the restored prefix ({base} tokens) ends inside a media item")
        steps: list[tuple[int, int]] = list(lease.extras_upto) if lease is not None else [(0, 0)]
        delta = lease.extra if lease is not None and isinstance(lease.extra, int) else 0
        positions = None
        if self.family.mrope is not None and len(tokens) > base:
            from chat.models.hf.mrope import mrope_positions

            grids = [grid for it in items for grid in _grids(it)]
            item_ends = {it.span.end for it in items}
            pieces, cursor, position = [], base, base + delta
            for end in sorted(item_ends | {len(tokens)}):  # window by window: the next position after each
                piece, position = mrope_positions(  # item is what an entry ending there must carry
                    self.family.mrope, end - cursor, grids, offset=cursor, next_position=position
                )
                pieces.append(piece)
                cursor = end
                if end in item_ends:
                    steps.append((end, position - end))
            positions = torch.cat(pieces, dim=1)
            delta = position - len(tokens)
        if not steps:
            steps = [(0, 0)]
        run.media = RunMedia(items=items, base=base, positions=positions, delta=delta, steps=steps)
        self.media_counters["items"] += len(prompt.items) if prompt is not None else 0
        return run

    def _blocks(self, run: RunState, q: int) -> tuple[tuple[int, int], ...]:
        """Bidirectional families: the items inside the next ``q`` tokens, as offsets into them.

        Raises:
            RunStateError: the tokens cut an item (the engine never feeds such a chunk).
        """
        if not self.family.bidirectional or q < 2:
            return ()
        plan, start, out = self._plan(run), run.length, []
        for it in plan.items:
            lo, hi = it.span.start, it.span.end
            if hi <= start or lo >= start + q:
                continue
            if lo < start or hi > start + q:
                raise RunStateError(f"{it.item}: a chunk of [{start}, {start + q}) cuts the item at [{lo}, {hi})")
            out.append((lo - start, hi - start))
        return tuple(out)

    def extras(self, run: RunState) -> tuple[tuple[int, int], ...]:
        """The extras of an entry stored at ``run.length``: (length, next position - length) steps (mRoPE only)."""
        plan = self._plan(run)
        if self.family.mrope is None:
            return ()
        return tuple(step for step in plan.steps if step[0] <= run.length)

    def close_run(self, run: RunState) -> None:
        plan = run.media
        if isinstance(plan, RunMedia):
            self.media_counters["encoder_skipped"] += plan.reused
            plan.features.clear()
        super().close_run(run)

    # ================================================================ internals

    def _plan(self, run: RunState) -> RunMedia:
        self._live(run)
        if not isinstance(run.media, RunMedia):
            raise RunStateError("this run has no media plan; make it with new_run")
        return run.media

    def _model_inputs(self, run: RunState, ids: torch.Tensor) -> dict[str, torch.Tensor]:
        plan = self._plan(run)
        start, q = run.length, ids.shape[1]
        embeds = self._embed(ids)  # [1, q, hidden]
        inputs: dict[str, torch.Tensor] = {"inputs_embeds": embeds}
        visual = torch.zeros((1, q), dtype=torch.bool, device=self.device)  # placeholders inside items
        stacked: list[torch.Tensor] = []  # their deepstack rows [layers, n, hidden], in token order
        for it in plan.items:
            lo, hi = max(it.span.start, start), min(it.span.end, start + q)
            if lo < hi:
                encoded = self._features(plan, it)
                rows = encoded.rows[lo - it.span.start : hi - it.span.start]
                embeds[0, lo - start : hi - start] = rows.to(embeds.dtype)
                if self.family.deepstack and encoded.deepstack is not None:
                    here = torch.isin(ids[0, lo - start : hi - start], self._placeholder_ids)
                    visual[0, lo - start : hi - start] = here
                    stacked.append(encoded.deepstack[:, lo - it.span.start : hi - it.span.start][:, here])
        if self.family.deepstack:  # always both keys: packed runs concatenate them on dim 1 (tokens), in input order
            inputs["visual_pos_masks"] = visual
            empty = embeds.new_zeros((self.family.deepstack, 0, embeds.shape[-1]))
            inputs["deepstack_visual_embeds"] = torch.cat(stacked, dim=1).to(embeds.dtype) if stacked else empty
        index = torch.arange(start, start + q, device=self.device)
        if self.family.mrope is None:
            return {**inputs, "position_ids": index.unsqueeze(0)}
        planned = 0 if plan.positions is None else plan.positions.shape[1]
        offsets = index - plan.base
        inside = offsets < planned
        positions = (index + plan.delta).unsqueeze(0).expand(3, q).clone()
        if bool(inside.any()):
            positions[:, inside] = plan.positions[:, offsets[inside]].to(positions.device)
        return {**inputs, "position_ids": positions.unsqueeze(1)}  # [3, 1, q]

    def _features(self, plan: RunMedia, it: PromptItem) -> EncodedItem:
        key = it.span.content_hash
        encoded = plan.features.get(key)
        if encoded is not None:
            return encoded
        stage = self._encoded_stage
        encoded = self.media_store.get(key, stage)
        if encoded is None:
            encoded = self._encode(it)
            want = it.span.end - it.span.start
            rows, deep = encoded.rows, encoded.deepstack
            if rows.dim() != 2 or rows.shape[0] != want:
                raise RunStateError(f"{it.item}: the encoder returned {tuple(rows.shape)} rows, the prompt has {want}")
            if deep is not None and (deep.dim() != 3 or deep.shape[1] != want):
                raise RunStateError(f"{it.item}: the encoder returned deepstack rows {tuple(deep.shape)} for {want}")
            self.media_store.put(key, encoded, encoded.nbytes, stage)
            plan.encoded += 1
            self.media_counters["encoded"] += 1
        else:
            plan.reused += 1
        plan.features[key] = encoded
        return encoded

    def _encode(self, it: PromptItem) -> EncodedItem:
        """The rows of one item's span: its encoder's output; for a video with its audio, the four markers' token
        embeddings around the video's and the audio's rows, run by run."""
        prep = it.prepared
        if prep.layout:
            return self._laid_out(it)
        if not prep.runs:
            return _encoded(it.span.kind.value, self.family.encoders[it.span.kind.value](self._full, prep))
        video = self.family.encoders["video"](self._full, prep)  # [video tokens, hidden]
        audio = self.family.encoders["audio"](self._full, prep)  # [audio tokens, hidden]
        marks = [self.family.markers[name] for name in AUDIO_IN_VIDEO_MARKERS]
        ends = self._embed(torch.tensor(marks, device=self.device)).to(video.dtype)  # [4, hidden]
        pieces, taken = [ends[:2]], {"video": 0, "audio": 0}
        for kind, count in prep.runs:
            source = video if kind == "video" else audio
            pieces.append(source[taken[kind] : taken[kind] + count].to(video.dtype))
            taken[kind] += count
        pieces.append(ends[2:])
        return EncodedItem(it.span.kind.value, torch.cat(pieces))

    def _laid_out(self, it: PromptItem) -> EncodedItem:
        """The rows of an item with a layout: the layout's token embeddings, the encoder's rows (in order) where the
        placeholder stands, as transformers merges them (and its deepstack rows there, zeros elsewhere)."""
        prep = it.prepared
        encoded = _encoded(it.span.kind.value, self.family.encoders[it.span.kind.value](self._full, prep))
        features = encoded.rows  # [placeholders, hidden]
        layout = torch.tensor(prep.layout, device=self.device)
        rows = self._embed(layout).to(features.dtype).clone()  # [span, hidden]
        at = layout == self.family.placeholders[it.span.kind.value]
        if int(at.sum()) != features.shape[0]:
            raise RunStateError(f"{it.item}: the encoder returned {features.shape[0]} rows for {int(at.sum())} places")
        rows[at] = features
        deep = None
        if encoded.deepstack is not None:
            deep = encoded.deepstack.new_zeros((encoded.deepstack.shape[0], len(prep.layout), features.shape[-1]))
            deep[:, at] = encoded.deepstack
        return EncodedItem(it.span.kind.value, rows, deep)


def _encoded(kind: str, out: Any) -> EncodedItem:
    """An encoder's output (rows, or rows and deepstack rows) for an item of ``kind`` as an :class:`EncodedItem`."""
    if isinstance(out, tuple):
        return EncodedItem(kind, *out)
    return EncodedItem(kind, out)


def _grids(it: PromptItem) -> list[Any]:
    """Where an item's tokens are placed in 3-D (:class:`chat.models.hf.mrope.MediaGrid` s): the whole item, or for a
    Qwen3-VL video each temporal patch as an image of one temporal step at its place in the layout (the text
    between them, timestamps and markers, is text)."""
    from chat.models.hf.mrope import MediaGrid

    prep, span = it.prepared, it.span
    if prep.frame_starts:
        t, h, w = prep.grid_thw  # type: ignore[misc]
        placeholder = prep.layout[prep.frame_starts[0]]
        per_frame = sum(1 for token in prep.layout if token == placeholder) // t
        return [MediaGrid("video", span.start + at, per_frame, (1, h, w)) for at in prep.frame_starts]
    return [
        MediaGrid(
            kind=span.kind.value,
            start=span.start,
            length=span.end - span.start,
            grid_thw=prep.grid_thw,
            second_per_grid=prep.second_per_grid,
            audio_length=prep.audio_tokens,
        )
    ]
