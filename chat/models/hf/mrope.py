"""3-D mRoPE position ids of the Qwen family (Qwen2-VL, Qwen2.5-VL, Qwen2.5-Omni thinker, Qwen3.5, Qwen3-VL),
computed incrementally.

These models give every token a (temporal, height, width) position. Text tokens take the same value on all three
axes, one more than the previous token's; the tokens of an image or video take their patch's place in a grid that
starts at the next position; after an item the positions jump, so the position after ``n`` tokens is not ``n``. The
prefix cache restores a model at a cached length ``n`` (never inside a media item) and stores with the entry the
*next position* there (or ``rope delta = next position - n``). :func:`mrope_positions` continues from it::

    positions, after = mrope_positions(spec, len(suffix), items, offset=n, next_position=n + delta)
    # positions: [3, len(suffix)] for the suffix tokens; rope delta at the end = after - (n + len(suffix))

It never looks at tokens: the caller says where each media item lies (:class:`MediaGrid`), text is everything else.
Splitting a sequence anywhere outside an item and computing the parts one after the other, each from the previous
part's ``after``, gives exactly the positions of the whole (the tests check this against transformers).

Rules (from transformers 5.23 ``get_rope_index``; ``m`` = spatial merge size, a grid of ``t x h x w`` patches fills
``t * (h/m) * (w/m)`` tokens, ``p`` = next position before the item):

- all families: an item's tokens are at ``(p + T[i], p + row, p + column)``, time-major; text and audio continue +1.
- ``qwen2_vl``: ``T[i] = i``. Also Qwen3.5 and Qwen3-VL (their images have ``t = 1``), whose videos are written
  frame group by frame group with timestamps between them: each group is one grid ``(1, h, w)`` of its own, and after
  a ``t = 1`` grid the ``"max"`` and ``"spatial"`` rules agree (``p + max(h, w)/m``: transformers 5.23's rule).
- ``qwen2_5_vl``: image ``T[i] = i``; video ``T[i] = long(i * float32(tokens_per_second * second_per_grid))``.
- ``qwen2_5_omni``: image ``T[i] = i * position_id_per_seconds``; video ``T[i] = long(i * second_per_grid *
  position_id_per_seconds)`` (float32); audio tokens are text-like; a video with its audio interleaved
  (``use_audio_in_video``) is supported, see :class:`MediaGrid`.
- After an image or video the next position is ``1 +`` the item's largest position (``vision_advance="max"``, the
  default: the rule of Qwen's reference code, transformers <= 5.2, and Omni in 5.23). transformers 5.3+ continues
  Qwen2-VL / Qwen2.5-VL *prompts* at ``p + max(h, w)/m`` instead (``vision_advance="spatial"``), yet its decode
  steps still continue from ``1 +`` the largest position (its ``rope_deltas``), so no one number reproduces both;
  the rules differ only after a video whose time axis reaches further than its height and width (see
  huggingface/transformers#45381: text resumed at 348 in 5.2, at 31 in 5.3).

Errors: ``ValueError`` with a message naming the item, for an unknown family, a span that does not match its grid,
overlapping spans, a span cut by the window (the prefix would end inside an item), or a kind the family lacks.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

__all__ = ["FAMILIES", "KINDS", "VISION_ADVANCES", "MediaGrid", "MropeSpec", "audio_in_video_runs", "mrope_positions"]

FAMILIES = ("qwen2_vl", "qwen2_5_vl", "qwen2_5_omni")
KINDS = ("image", "video", "audio")
VISION_ADVANCES = ("max", "spatial")
_MODEL_TYPES = {  # model type -> the rules it follows
    "qwen2_vl": "qwen2_vl",
    "qwen2_5_vl": "qwen2_5_vl",
    "qwen2_5_omni_thinker": "qwen2_5_omni",
    "qwen3_5": "qwen2_vl",  # as Qwen3-VL (below)
    "qwen3_vl": "qwen2_vl",  # images as Qwen2-VL's; each video frame group is placed as an image of one temporal
    "qwen3_vl_moe": "qwen2_vl",  # step (the caller passes one grid (1, h, w) per group; timestamps between are text)
}
_DEFAULT_TIME_SCALE = {"qwen2_vl": 1.0, "qwen2_5_vl": 4.0, "qwen2_5_omni": 25.0}  # transformers 5.23 config defaults
_OMNI_BOS_EOS = 2  # audio-in-video: <vision_bos><audio_bos> before the interleaved run, <audio_eos><vision_eos> after


@dataclass(frozen=True, slots=True)
class MropeSpec:
    """What a model family needs to place its media: one per model, built by :meth:`from_config`."""

    family: str  # one of FAMILIES
    spatial_merge_size: int  # m: a token covers m x m patches
    time_scale: float = 1.0  # temporal positions per second of video: Qwen2.5-VL `tokens_per_second`,
    # Omni `position_id_per_seconds` (unused by Qwen2-VL)
    seconds_per_chunk: float = 2.0  # Omni audio-in-video: seconds of video and audio per interleaved chunk
    vision_advance: str = "max"  # where text resumes after an image/video: "max" or "spatial" (see module docs)
    image_token_id: int | None = None  # placeholder tokens, for callers locating items (positions never read tokens)
    video_token_id: int | None = None
    audio_token_id: int | None = None

    def __post_init__(self) -> None:
        if self.family not in FAMILIES:
            raise ValueError(f"unknown mRoPE family {self.family!r}: use one of {', '.join(FAMILIES)}")
        if not _is_int(self.spatial_merge_size) or self.spatial_merge_size < 1:
            raise ValueError(f"spatial_merge_size must be a positive integer, got {self.spatial_merge_size!r}")
        for name in ("time_scale", "seconds_per_chunk"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value <= 0:
                raise ValueError(f"{name} must be a positive finite number, got {value!r}")
        if self.vision_advance not in VISION_ADVANCES:
            raise ValueError(f"vision_advance must be one of {', '.join(VISION_ADVANCES)}, got {self.vision_advance!r}")
        if self.vision_advance == "spatial" and self.family == "qwen2_5_omni":
            raise ValueError('vision_advance="spatial" is a Qwen2-VL / Qwen2.5-VL rule; Omni always uses "max"')

    @classmethod
    def from_config(cls, config: Any, *, vision_advance: str = "max") -> MropeSpec:
        """The spec of a transformers config (read by attribute name; nothing is imported).

        Accepts the configs of Qwen2-VL, Qwen2.5-VL, the Qwen2.5-Omni thinker and the whole Qwen2.5-Omni model (its
        ``thinker_config``). Pass ``vision_advance="spatial"`` to reproduce transformers 5.3+ prompt positions after a
        long video on Qwen2-VL / Qwen2.5-VL (see the module docs).

        Raises:
            ValueError: another model type (e.g. Qwen3-Omni, whose rules are not implemented), or a config
                missing the vision settings.
        """
        model_type = getattr(config, "model_type", None)
        if model_type == "qwen2_5_omni" and getattr(config, "thinker_config", None) is not None:
            config, model_type = config.thinker_config, getattr(config.thinker_config, "model_type", None)
        family = _MODEL_TYPES.get(str(model_type))
        if family is None:
            raise ValueError(
                f"no mRoPE rules for model type {model_type!r}: supported are {', '.join(sorted(_MODEL_TYPES))} "
                "and qwen2_5_omni"
            )
        vision = getattr(config, "vision_config", None)
        merge = getattr(vision, "spatial_merge_size", None)
        if merge is None:
            raise ValueError(f"the {model_type} config has no vision_config.spatial_merge_size")
        if family == "qwen2_5_vl":
            scale = getattr(vision, "tokens_per_second", None) or getattr(config, "tokens_per_second", None)
        elif family == "qwen2_5_omni":
            scale = getattr(config, "position_id_per_seconds", None)
        else:
            scale = None
        chunk = getattr(config, "seconds_per_chunk", None) if family == "qwen2_5_omni" else None
        return cls(
            family=family,
            spatial_merge_size=int(merge),
            time_scale=float(scale if scale is not None else _DEFAULT_TIME_SCALE[family]),
            seconds_per_chunk=float(chunk if chunk is not None else 2.0),
            vision_advance=vision_advance,
            image_token_id=_token(config, "image_token_id", "image_token_index"),
            video_token_id=_token(config, "video_token_id", "video_token_index"),
            audio_token_id=_token(config, "audio_token_id", "audio_token_index"),
        )


@dataclass(frozen=True, slots=True)
class MediaGrid:
    """One media item's token span and shape.

    ``[start, start + length)`` are the item's tokens in the whole sequence: its placeholder tokens, i.e.
    ``t * (h/m) * (w/m)`` for an image or video of ``grid_thw = (t, h, w)`` patches, any count >= 1 for audio. The
    family's begin/end marker tokens around an item are ordinary text, except for an Omni video with its audio
    interleaved (``audio_length`` set): its span is ``<vision_bos><audio_bos>``, the interleaved video and audio
    tokens, then ``<audio_eos><vision_eos>`` (``length = 4 + video tokens + audio_length``), because transformers
    places those four markers differently from text.
    """

    kind: str  # "image" | "video" | "audio"
    start: int  # index of the span's first token in the whole sequence
    length: int  # tokens in the span
    grid_thw: tuple[int, int, int] | None = None  # image / video: patches along time, height, width before merging
    second_per_grid: float | None = None  # video: seconds per temporal patch (Qwen2.5-VL, Omni); None means 1.0
    audio_length: int | None = None  # Omni video only: audio tokens interleaved with it (use_audio_in_video)

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"unknown media kind {self.kind!r}: use one of {', '.join(KINDS)}")
        if not _is_int(self.start) or self.start < 0 or not _is_int(self.length) or self.length < 1:
            raise ValueError(f"{self.kind} span needs start >= 0 and length >= 1, got {self.start!r}, {self.length!r}")
        if self.kind == "audio":
            if self.grid_thw is not None or self.audio_length is not None:
                raise ValueError("an audio item has no grid_thw or audio_length (its length is its token count)")
            return
        try:
            grid = tuple(int(v) for v in self.grid_thw)  # type: ignore[union-attr]
        except TypeError:
            raise ValueError(f"{self.kind} at {self.start} needs grid_thw = (t, h, w), got {self.grid_thw!r}") from None
        if len(grid) != 3 or min(grid) < 1:
            raise ValueError(f"{self.kind} at {self.start}: grid_thw must be three positive sizes, got {grid}")
        object.__setattr__(self, "grid_thw", grid)
        spg = self.second_per_grid
        if spg is not None and (isinstance(spg, bool) or not math.isfinite(float(spg)) or float(spg) < 0):
            raise ValueError(f"video at {self.start}: second_per_grid must be a finite number >= 0, got {spg!r}")
        if self.audio_length is not None and (
            self.kind != "video" or not _is_int(self.audio_length) or self.audio_length < 1
        ):
            raise ValueError(f"audio_length (audio in video) must be a positive integer on a video, got {self!r}")

    @property
    def end(self) -> int:
        """One past the span's last token."""
        return self.start + self.length


def mrope_positions(
    spec: MropeSpec,
    token_count: int,
    media: Sequence[MediaGrid] = (),
    *,
    offset: int = 0,
    next_position: int | None = None,
) -> tuple[torch.Tensor, int]:
    """Positions of the ``token_count`` tokens at ``[offset, offset + token_count)`` of a sequence.

    ``next_position`` is the position the token at ``offset`` would get if it were text: 0 at the start of a
    sequence, the ``after`` of the previous window otherwise (``None`` means ``offset``, i.e. no media before).
    ``media`` may hold the items of the whole sequence in any order: items entirely outside the window are ignored.

    Returns:
        ``(positions, after)``: a LongTensor ``[3, token_count]`` (temporal, height, width) on the CPU, and the next
        position after the window. Store ``after - (offset + token_count)`` as the rope delta of a prefix ending
        there; decode steps are text: token ``k`` after the window is at ``after + k`` on all three axes.

    Raises:
        ValueError: a span only partly inside the window (a cut inside an item), overlapping spans, a span whose
            length does not match its grid, a kind the family does not take, or negative sizes.
    """
    if not _is_int(token_count) or token_count < 0 or not _is_int(offset) or offset < 0:
        raise ValueError(f"token_count and offset must be integers >= 0, got {token_count!r}, {offset!r}")
    position = offset if next_position is None else next_position
    if not _is_int(position) or position < 0:
        raise ValueError(f"next_position must be an integer >= 0, got {next_position!r}")
    window_end = offset + token_count
    items = _window_items(spec, media, offset, window_end)

    pieces: list[torch.Tensor] = []  # each [3, n]
    cursor = offset  # sequence index of the next token to place
    for item in items:
        if item.start > cursor:
            pieces.append(_text(position, item.start - cursor))
            position += item.start - cursor
        block, position = _item_positions(spec, item, position)
        pieces.append(block)
        cursor = item.end
    if window_end > cursor:
        pieces.append(_text(position, window_end - cursor))
        position += window_end - cursor
    positions = torch.cat(pieces, dim=1) if pieces else torch.zeros(3, 0, dtype=torch.long)
    assert positions.shape == (3, token_count), positions.shape
    return positions, position


def audio_in_video_runs(spec: MropeSpec, grid: MediaGrid) -> tuple[tuple[str, int], ...]:
    """The token runs of an Omni video with its audio interleaved (``grid.audio_length`` set), between its two begin
    and two end markers: ``("video", n)`` and ``("audio", m)`` by time chunks, the video's first in each chunk. This
    is the layout transformers' processor writes and the order its ``get_rope_index`` places positions in; render a
    prompt with it and :func:`mrope_positions` gives every token its position.

    Raises:
        ValueError: ``grid`` is not a video with ``audio_length``, or ``spec`` is not Qwen2.5-Omni's.
    """
    if grid.kind != "video" or grid.audio_length is None or spec.family != "qwen2_5_omni":
        raise ValueError(f"audio-in-video runs need a Qwen2.5-Omni video with audio_length, got {grid!r}")
    _, _, runs = _interleaved(spec, grid)
    return tuple((kind, hi - lo) for kind, lo, hi in runs if hi > lo)


# ==================================================================================================== internals


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _token(config: Any, *names: str) -> int | None:
    for name in names:
        value = getattr(config, name, None)
        if value is not None:
            return int(value)
    return None


def _window_items(spec: MropeSpec, media: Sequence[MediaGrid], lo: int, hi: int) -> list[MediaGrid]:
    """The items inside ``[lo, hi)``, sorted and checked; items entirely outside are dropped."""
    items = sorted(media, key=lambda it: it.start)
    for a, b in itertools.pairwise(items):
        if b.start < a.end:
            raise ValueError(f"media spans overlap: {a.kind} [{a.start}, {a.end}) and {b.kind} [{b.start}, {b.end})")
    inside = []
    for item in items:
        if item.end <= lo or item.start >= hi:
            continue
        if item.start < lo or item.end > hi:
            raise ValueError(
                f"the window [{lo}, {hi}) cuts the {item.kind} at [{item.start}, {item.end}): "
                "a window must start and end outside media items"
            )
        _check_item(spec, item)
        inside.append(item)
    return inside


def _check_item(spec: MropeSpec, item: MediaGrid) -> None:
    where = f"{item.kind} at [{item.start}, {item.end})"
    if item.kind == "audio":
        if spec.family != "qwen2_5_omni":
            raise ValueError(f"{where}: {spec.family} takes no audio")
        return
    if item.audio_length is not None and spec.family != "qwen2_5_omni":
        raise ValueError(f"{where}: audio interleaved in video is a Qwen2.5-Omni feature, not {spec.family}")
    t, h, w = item.grid_thw  # type: ignore[misc]
    m = spec.spatial_merge_size
    if h % m or w % m:
        raise ValueError(f"{where}: grid {item.grid_thw} has height/width not divisible by the merge size {m}")
    expected = t * (h // m) * (w // m)
    if item.audio_length is not None:
        expected += item.audio_length + 2 * _OMNI_BOS_EOS
    if item.length != expected:
        raise ValueError(
            f"{where}: the span holds {item.length} tokens but grid {item.grid_thw}"
            + (f" with {item.audio_length} audio tokens and 4 markers" if item.audio_length is not None else "")
            + f" fills {expected}"
        )


def _text(position: int, count: int) -> torch.Tensor:
    return torch.arange(position, position + count, dtype=torch.long).expand(3, count)


def _item_positions(spec: MropeSpec, item: MediaGrid, position: int) -> tuple[torch.Tensor, int]:
    """``(positions [3, item.length], next position)`` of one item placed at ``position``."""
    if item.kind == "audio":
        return _text(position, item.length), position + item.length
    if item.audio_length is not None:
        return _audio_in_video(spec, item, position)
    _, h, w = item.grid_thw  # type: ignore[misc]
    m = spec.spatial_merge_size
    block = _grid(_temporal(spec, item), h // m, w // m) + position
    if spec.vision_advance == "spatial":
        return block, position + max(h, w) // m
    return block, int(block.max()) + 1


def _temporal(spec: MropeSpec, item: MediaGrid) -> torch.Tensor:
    """Temporal offsets of the item's ``t`` grid steps, with transformers' float32 arithmetic and truncation."""
    t = item.grid_thw[0]  # type: ignore[index]
    steps = torch.arange(t)
    if spec.family == "qwen2_vl":
        return steps
    if spec.family == "qwen2_5_vl":
        if item.kind == "image":
            return steps
        spg = torch.tensor(1.0 if item.second_per_grid is None else float(item.second_per_grid), dtype=torch.float32)
        return (steps * (spg * spec.time_scale)).long()  # interval rounded to float32 first, as transformers does
    if item.kind == "image":
        return (steps * spec.time_scale).long()
    spg = torch.tensor(1.0 if item.second_per_grid is None else float(item.second_per_grid), dtype=torch.float32)
    return (steps * spg * spec.time_scale).long()  # (i * spg) * scale, in this order, as transformers does


def _grid(temporal: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
    """``[3, t*rows*cols]`` offsets (temporal, row, column), time-major then row-major."""
    t = temporal.numel()
    return torch.stack(
        [
            temporal.view(t, 1, 1).expand(t, rows, cols),
            torch.arange(rows).view(1, rows, 1).expand(t, rows, cols),
            torch.arange(cols).view(1, 1, cols).expand(t, rows, cols),
        ]
    ).reshape(3, -1)


def _audio_in_video(spec: MropeSpec, item: MediaGrid, position: int) -> tuple[torch.Tensor, int]:
    """Omni ``use_audio_in_video``: two begin markers at ``p``, video and audio interleaved by time chunks from
    ``p + 1``, two end markers at ``1 +`` the largest position of the *last chunk* (transformers' rule), text after."""
    start = position + 1
    video, audio, runs = _interleaved(spec, item)  # offsets from start
    parts = [_text(position, 1), _text(position, 1)]
    parts += [(video if kind == "video" else audio)[:, lo:hi] + start for kind, lo, hi in runs]
    end = int(parts[-1].max()) + 1  # the last chunk of the longer list (audio's if equal): never empty
    parts += [_text(end, 1), _text(end, 1)]
    return torch.cat(parts, dim=1), end + 1


def _interleaved(spec: MropeSpec, item: MediaGrid) -> tuple[torch.Tensor, torch.Tensor, list[tuple[str, int, int]]]:
    """An audio-in-video item's video and audio position offsets (``[3, n]`` each, from the first token after the
    markers) and its chunks in token order: ``(kind, lo, hi)`` slices of those offsets, video then audio per chunk."""
    _, h, w = item.grid_thw  # type: ignore[misc]
    m = spec.spatial_merge_size
    video = _grid(_temporal(spec, item), h // m, w // m)
    audio = _text(0, item.audio_length)  # type: ignore[arg-type]
    per_chunk = int(spec.time_scale * spec.seconds_per_chunk)
    video_chunks = _chunk_bounds(video[0].tolist(), per_chunk)
    audio_chunks = _chunk_bounds(audio[0].tolist(), per_chunk)
    runs: list[tuple[str, int, int]] = []
    for j in range(max(len(video_chunks), len(audio_chunks))):
        if j < len(video_chunks):
            runs.append(("video", *video_chunks[j]))
        if j < len(audio_chunks):
            runs.append(("audio", *audio_chunks[j]))
    return video, audio, runs


def _chunk_bounds(values: list[int], per_chunk: int) -> list[tuple[int, int]]:
    """Split non-decreasing temporal offsets into chunks ``[k * per_chunk, (k+1) * per_chunk)``, exactly as
    transformers' ``get_chunked_index`` does (one chunk boundary at most per element, so a jump over several chunk
    lengths opens one chunk per following element until it catches up)."""
    bounds, first, chunk = [], 0, 1
    for i, value in enumerate(values):
        if value >= chunk * per_chunk:
            bounds.append((first, i))
            first, chunk = i, chunk + 1
    bounds.append((first, len(values)))
    return bounds
