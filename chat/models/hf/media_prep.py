"""Media bytes -> what a model's encoder takes, and how many placeholder tokens the item fills in the prompt.

One *preparer* per (family, kind). ``prepare(data, declared, item)`` decodes with :mod:`modalities` (limits, format
checks, typed errors naming the item) and runs the model's own preprocessing: the ``...ImageProcessorPil`` classes of
transformers (torchvision is not usable here), ``WhisperFeatureExtractor`` for audio, and our own temporal patchifying
for video frames (the same layout as transformers' Qwen2-VL video processor). Every preparer has a
:class:`modalities.Fingerprint` naming its class and every setting that changes its output, so that the content hash
``sha256(bytes) + fingerprint`` identifies the prepared result.

A Qwen2.5-Omni video with an audio track is one item made of several token runs (``use_audio_in_video``): its frames
and its sound, each prepared as its own kind would be, interleaved by time chunks (:attr:`PreparedMedia.runs`).
A Qwen3-VL video is one item written frame group by frame group, each with its timestamp as text before it
(:class:`TimestampedVideoPreparer`, :attr:`PreparedMedia.frame_starts`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from modalities import audio as audio_mod
from modalities import image as image_mod
from modalities import video as video_mod
from modalities.audio import AudioOptions
from modalities.errors import UnsupportedFormatError
from modalities.identity import Fingerprint
from modalities.image import ImageOptions
from modalities.limits import AudioLimits, ImageLimits, VideoLimits
from modalities.video import VideoOptions

DEFAULT_VIDEO_FPS = 2.0  # Qwen's processors assume this when a video's sampling rate is unknown
IMAGE_LIMITS, IMAGE_OPTIONS = ImageLimits(), ImageOptions()  # defaults of the preparers (immutable)
VIDEO_LIMITS, VIDEO_OPTIONS = VideoLimits(), VideoOptions()
AUDIO_LIMITS = AudioLimits()


@dataclass(frozen=True, slots=True, eq=False)
class PreparedMedia:
    """One media item ready for the encoder."""

    kind: str  # "image" | "audio" | "video"
    tokens: int  # placeholder tokens the item fills in the prompt (= rows the encoder returns)
    inputs: Mapping[str, torch.Tensor] = field(repr=False)  # the encoder's inputs (family specific names)
    grid_thw: tuple[int, int, int] | None = None  # image / video: patches along time, height, width (before merging)
    second_per_grid: float | None = None  # video: seconds covered by one temporal patch
    audio_tokens: int | None = None  # a video with its audio track: the audio's tokens (its features in `inputs`)
    runs: tuple[tuple[str, int], ...] = ()  # a video with its audio track: ("video", n) / ("audio", m) token runs in
    # prompt order, between <vision_bos><audio_bos> and <audio_eos><vision_eos>; () for every other item
    layout: tuple[int, ...] = ()  # the item's span as token ids when it is more than its placeholder repeated
    # (SmolVLM: tile markers, row breaks and image tokens; the encoder's rows go where the placeholder stands);
    # () for a run of `tokens` placeholders
    frame_starts: tuple[int, ...] = ()  # Qwen3-VL videos: where each temporal patch's placeholder run starts in
    # the layout (each is placed like an image of grid (1, h, w)); () for every other item

    @property
    def nbytes(self) -> int:
        """Memory held (what the media store charges)."""
        return sum(t.numel() * t.element_size() for t in self.inputs.values())


class Preparer(Protocol):
    kind: str  # the modality it prepares
    fingerprint: Fingerprint  # every setting between bytes and encoder input

    def prepare(self, data: bytes, declared: str | None, item: str) -> PreparedMedia:
        """Decode and preprocess one item. Raises :class:`modalities.MediaError` subclasses naming ``item``."""
        ...


def _settings(processor: Any, names: tuple[str, ...]) -> dict[str, object]:
    """The named settings of a transformers processor, as plain JSON values (for the fingerprint)."""
    import json

    full = json.loads(processor.to_json_string()) if hasattr(processor, "to_json_string") else vars(processor)
    return {name: full[name] for name in names if full.get(name) is not None}


# ================================================================ Qwen2-VL family (Qwen2-VL, Qwen2.5-VL, Omni)


_PIXEL_SETTINGS = (
    "size",
    "image_mean",
    "image_std",
    "resample",
    "rescale_factor",
    "do_resize",
    "do_rescale",
    "do_normalize",
)  # every Pillow image processor's settings that change its output
_QWEN_SETTINGS = (*_PIXEL_SETTINGS, "patch_size", "merge_size", "temporal_patch_size")
_CLIP_SETTINGS = (*_PIXEL_SETTINGS, "crop_size", "do_center_crop", "do_pad")


class QwenImagePreparer:
    """Images for Qwen2-VL-style vision towers: resized to multiples of patch*merge within the pixel budget,
    flattened into ``[patches, C*T*P*P]`` with ``image_grid_thw``."""

    kind = "image"

    def __init__(self, processor: Any, limits: ImageLimits = IMAGE_LIMITS, options: ImageOptions = IMAGE_OPTIONS):
        self.processor = processor  # a Qwen2VLImageProcessorPil
        self.limits = limits
        self.options = options
        self.merge = int(processor.merge_size)
        self.fingerprint = image_mod.fingerprint(
            type(processor).__name__, options, _settings(processor, _QWEN_SETTINGS)
        )

    def prepare(self, data: bytes, declared: str | None, item: str) -> PreparedMedia:
        decoded = image_mod.decode(data, self.limits, self.options, declared=declared, item=item)
        try:
            out = self.processor(images=[decoded.image], return_tensors="pt")
        except ValueError as exc:  # its smart_resize refuses an aspect ratio over 200
            raise UnsupportedFormatError(f"the image cannot be taken by this model: {exc}", item=item) from exc
        t, h, w = (int(v) for v in out["image_grid_thw"][0])
        return PreparedMedia(
            "image",
            tokens=t * h * w // self.merge**2,
            inputs={"pixel_values": out["pixel_values"].float(), "image_grid_thw": out["image_grid_thw"]},
            grid_thw=(t, h, w),
        )


class QwenVideoPreparer:
    """Videos for Qwen2-VL-style vision towers: N evenly spaced frames (see :mod:`modalities.video`), each resized
    and normalised by the image processor, grouped ``temporal_patch_size`` frames per temporal patch (the last frame
    repeated to fill the last group), in the row layout of transformers' Qwen2-VL video processor.

    With ``audio`` (Qwen2.5-Omni, ``use_audio_in_video``), a video's own audio track is prepared by that preparer and
    interleaved with the frames by time chunks (``mrope`` gives the chunking rule); a video without an audio stream
    is prepared as video alone. An audio track over the audio preparer's limits fails the item.
    """

    kind = "video"

    def __init__(
        self,
        processor: Any,
        limits: VideoLimits = VIDEO_LIMITS,
        options: VideoOptions = VIDEO_OPTIONS,
        *,
        audio: WhisperAudioPreparer | None = None,
        mrope: Any = None,
    ):
        self.processor = processor  # a Qwen2VLImageProcessorPil configured with the video pixel budget
        self.limits = limits
        self.options = options
        self.merge = int(processor.merge_size)
        self.temporal = int(processor.temporal_patch_size)
        self.patch = int(processor.patch_size)
        self.audio = audio  # prepares the video's audio track (Omni); None: the track is not used
        self.mrope = mrope  # chat.models.hf.mrope.MropeSpec: how audio and video interleave (with `audio`)
        if audio is not None and mrope is None:
            raise ValueError("a video preparer that takes the audio track needs the model's MropeSpec")
        settings = _settings(processor, _QWEN_SETTINGS)
        if audio is not None:  # the track and the interleaving change the item's model input
            interleave = {"time_scale": mrope.time_scale, "seconds_per_chunk": mrope.seconds_per_chunk}
            settings["audio_in_video"] = {"audio": audio.fingerprint.text, **interleave}
        self.fingerprint = video_mod.fingerprint(type(processor).__name__ + "/frames", options, settings)

    def prepare(self, data: bytes, declared: str | None, item: str) -> PreparedMedia:
        frames = self._frames(data, declared, item)
        track = self._audio_track(data, declared, item)
        if track is None:
            return frames
        from chat.models.hf.mrope import MediaGrid, audio_in_video_runs

        span = 4 + frames.tokens + track.tokens  # the item in the prompt: 4 markers, the video's and the audio's tokens
        grid = MediaGrid("video", 0, span, frames.grid_thw, frames.second_per_grid, audio_length=track.tokens)
        return PreparedMedia(
            "video",
            tokens=span - 2,  # <audio_bos> runs <audio_eos> (the template's vision markers frame them)
            inputs={**frames.inputs, **track.inputs},
            grid_thw=frames.grid_thw,
            second_per_grid=frames.second_per_grid,
            audio_tokens=track.tokens,
            runs=audio_in_video_runs(self.mrope, grid),
        )

    def _audio_track(self, data: bytes, declared: str | None, item: str) -> PreparedMedia | None:
        """The video's audio, prepared; None without an audio preparer or an audio stream."""
        if self.audio is None:
            return None
        try:
            return self.audio.prepare(data, declared, item)
        except UnsupportedFormatError as exc:
            if exc.code == "no_stream":
                return None
            raise

    def _frames(self, data: bytes, declared: str | None, item: str) -> PreparedMedia:
        decoded = video_mod.decode(data, self.limits, self.options, declared=declared, item=item)
        frames = list(decoded.frames)
        while len(frames) % self.temporal:
            frames.append(frames[-1])
        try:
            pixels, (t, h, w) = _temporal_patches(self.processor, frames, {})
        except ValueError as exc:  # its smart_resize refuses an aspect ratio over 200
            raise UnsupportedFormatError(f"the video cannot be taken by this model: {exc}", item=item) from exc
        fps = decoded.sample_fps if decoded.sample_fps > 0 else DEFAULT_VIDEO_FPS
        return PreparedMedia(
            "video",
            tokens=t * h * w // self.merge**2,
            inputs={"pixel_values_videos": pixels, "video_grid_thw": torch.tensor([[t, h, w]])},
            grid_thw=(t, h, w),
            second_per_grid=self.temporal / fps,
        )


def _temporal_patches(processor: Any, frames: list[Any], options: dict[str, Any]) -> tuple[torch.Tensor, tuple]:
    """``(pixels [t*h*w, C*T*P*P], (t, h, w))`` of ``frames`` (a multiple of the temporal patch size): each frame
    through the Qwen2-VL image processor (called with ``options``), grouped ``temporal_patch_size`` frames per
    temporal patch, in the row layout of transformers' Qwen2-VL / Qwen3-VL video processors."""
    temporal, patch = int(processor.temporal_patch_size), int(processor.patch_size)
    out = processor(images=frames, return_tensors="pt", **options)  # each frame as an image, time broadcast
    _, h, w = (int(v) for v in out["image_grid_thw"][0])
    per_frame = out["pixel_values"].float().reshape(len(frames), h * w, 3, temporal, patch, patch)
    first = per_frame[:, :, :, 0]  # [frames, rows, C, P, P]: every temporal copy is the same frame
    groups = first.reshape(len(frames) // temporal, temporal, h * w, 3, patch, patch)
    pixels = groups.permute(0, 2, 3, 1, 4, 5).reshape(-1, 3 * temporal * patch * patch)
    return pixels.contiguous(), (len(frames) // temporal, h, w)


@dataclass(frozen=True, slots=True)
class FrameMarkers:
    """How a Qwen3-VL video is written in the prompt (what ``Qwen3VLProcessor`` puts in place of the video token):
    per temporal patch, its time as text (``<1.5 seconds>``: the mean of its first and last frame's times, one
    decimal), ``<|vision_start|>``, its placeholder tokens and ``<|vision_end|>``. The text lies between special
    tokens, so its tokens do not depend on what is around it."""

    video: int  # <|video_pad|>
    start: int  # <|vision_start|>
    end: int  # <|vision_end|>
    encode: Any  # text -> token ids (the model's tokenizer, no special tokens added)

    def layout(self, times: list[float], tokens_per_frame: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """``(layout, frame_starts)``: the item's tokens, and where each temporal patch's placeholders begin."""
        out: list[int] = []
        starts: list[int] = []
        for seconds in times:
            out += self.encode(f"<{seconds:.1f} seconds>")
            out.append(self.start)
            starts.append(len(out))
            out += [self.video] * tokens_per_frame
            out.append(self.end)
        return tuple(out), tuple(starts)


class TimestampedVideoPreparer:
    """Videos for Qwen3-VL: N evenly spaced frames (see :mod:`modalities.video`; an odd count gets its last frame
    repeated), all resized to one size chosen as ``Qwen3VLVideoProcessor`` chooses it (its ``smart_resize``: the
    pixel budget ``size`` covers the whole clip, ``temporal_patch_size`` frames per patch), then normalised by the
    image processor and grouped into temporal patches; the item's span is :class:`FrameMarkers`' layout, each group's
    time from the decoded frames' own timestamps (the processor's ``frame index / fps`` for a constant frame rate).
    A one-frame video is sized as two frames (the processor refuses it) and its frame repeated.
    """

    kind = "video"

    def __init__(
        self,
        processor: Any,
        markers: FrameMarkers,
        limits: VideoLimits = VIDEO_LIMITS,
        options: VideoOptions = VIDEO_OPTIONS,
    ):
        self.processor = processor  # a Qwen2VLImageProcessorPil holding the video settings (size: the clip's budget)
        self.markers = markers  # how frame groups are written
        self.limits = limits
        self.options = options
        self.merge = int(processor.merge_size)
        self.temporal = int(processor.temporal_patch_size)
        settings = {**_settings(processor, _QWEN_SETTINGS), "layout": "qwen3_vl timestamps/1"}
        self.fingerprint = video_mod.fingerprint(type(processor).__name__ + "/timestamped", options, settings)

    def prepare(self, data: bytes, declared: str | None, item: str) -> PreparedMedia:
        from PIL import Image
        from transformers.models.qwen3_vl.video_processing_qwen3_vl import smart_resize

        decoded = video_mod.decode(data, self.limits, self.options, declared=declared, item=item)
        frames, times = list(decoded.frames), [float(t) for t in decoded.timestamps]
        sampled = max(len(frames), self.temporal)  # the processor sizes the sampled frames (it refuses one frame)
        while len(frames) % self.temporal:  # as the processor pads: the last frame (and its index) repeated
            frames.append(frames[-1])
            times.append(times[-1])
        height, width = frames[0].shape[:2]
        size = self.processor.size
        try:
            new_h, new_w = smart_resize(
                sampled,
                height,
                width,
                temporal_factor=self.temporal,
                factor=int(self.processor.patch_size) * self.merge,
                min_pixels=size["shortest_edge"],
                max_pixels=size["longest_edge"],
            )
        except ValueError as exc:  # an aspect ratio over 200
            raise UnsupportedFormatError(f"the video cannot be taken by this model: {exc}", item=item) from exc
        resample = Image.Resampling(int(self.processor.resample))
        resized = [Image.fromarray(f).resize((new_w, new_h), resample=resample) for f in frames]
        pixels, (t, h, w) = _temporal_patches(self.processor, resized, {"do_resize": False})
        group_times = [(times[i] + times[i + self.temporal - 1]) / 2 for i in range(0, len(times), self.temporal)]
        layout, starts = self.markers.layout(group_times, h * w // self.merge**2)
        return PreparedMedia(
            "video",
            tokens=len(layout),
            inputs={"pixel_values_videos": pixels, "video_grid_thw": torch.tensor([[t, h, w]])},
            grid_thw=(t, h, w),
            layout=layout,
            frame_starts=starts,
        )


def whisper_output_tokens(frames: int) -> int:
    """Tokens the Qwen2-Audio / Omni audio tower makes of ``frames`` mel frames (two stride-2 stages)."""
    after_conv = (frames - 1) // 2 + 1
    return (after_conv - 2) // 2 + 1


class WhisperAudioPreparer:
    """Audio for Whisper-style encoders: mono at the extractor's rate, log-mel features of the valid frames only
    (at most the extractor's window: longer clips are refused, never cut silently)."""

    kind = "audio"

    def __init__(self, extractor: Any, limits: AudioLimits = AUDIO_LIMITS):
        self.extractor = extractor  # a WhisperFeatureExtractor
        rate = int(extractor.sampling_rate)
        window = float(extractor.n_samples) / rate  # seconds one call covers (30 s for Whisper)
        self.limits = AudioLimits(
            max_bytes=limits.max_bytes,
            max_seconds=min(limits.max_seconds, window),
            max_sample_rate=limits.max_sample_rate,
            max_channels=limits.max_channels,
        )
        self.options = AudioOptions(sample_rate=rate)
        self.fingerprint = audio_mod.fingerprint(
            type(extractor).__name__,
            self.options,
            _settings(extractor, ("feature_size", "sampling_rate", "hop_length", "n_fft", "chunk_length")),
        )

    def prepare(self, data: bytes, declared: str | None, item: str) -> PreparedMedia:
        decoded = audio_mod.decode(data, self.limits, self.options, declared=declared, item=item)
        out = self.extractor(
            [decoded.samples],
            sampling_rate=decoded.sample_rate,
            return_attention_mask=True,
            padding="max_length",
            return_tensors="pt",
        )
        frames = int(out["attention_mask"][0].sum())
        features = out["input_features"][0, :, :frames].float().contiguous()  # [mels, frames]
        return PreparedMedia("audio", tokens=whisper_output_tokens(frames), inputs={"input_features": features})


# ================================================================ LLaVA


class ClipImagePreparer:
    """Images for CLIP-style towers (LLaVA): resized and centre-cropped to the tower's square input."""

    kind = "image"

    def __init__(
        self, processor: Any, tokens: int, limits: ImageLimits = IMAGE_LIMITS, options: ImageOptions = IMAGE_OPTIONS
    ):
        self.processor = processor  # a CLIPImageProcessorPil / LlavaImageProcessorPil
        self.tokens = tokens  # placeholder tokens per image (the tower's patch count, maybe + CLS)
        self.limits = limits
        self.options = options
        self.fingerprint = image_mod.fingerprint(
            type(processor).__name__, options, _settings(processor, _CLIP_SETTINGS)
        )

    def prepare(self, data: bytes, declared: str | None, item: str) -> PreparedMedia:
        decoded = image_mod.decode(data, self.limits, self.options, declared=declared, item=item)
        out = self.processor(images=[decoded.image], return_tensors="pt")
        return PreparedMedia("image", tokens=self.tokens, inputs={"pixel_values": out["pixel_values"].float()})


# ================================================================ SmolVLM / Idefics3 (tiles + a global image)

_SPLIT_SETTINGS = (*_PIXEL_SETTINGS, "max_image_size", "do_image_splitting", "do_pad")


@dataclass(frozen=True, slots=True)
class TileMarkers:
    """How a SmolVLM / Idefics3 image is written in the prompt: each tile as ``<fake_token_around_image>``,
    ``<row_R_col_C>`` and ``seq_len`` image tokens, a line break after each row of tiles, then a line break and the
    global image as ``<fake_token_around_image><global-img>``, its image tokens and ``<fake_token_around_image>``.
    An image small enough for one tile is the global image alone. The text is tokenized as the model's tokenizer
    does it; the markers are special tokens, so an item's tokens do not depend on the text around it."""

    image: str  # the image placeholder, e.g. "<image>"
    around: str  # "<fake_token_around_image>"
    global_image: str  # "<global-img>"
    seq_len: int  # image tokens per tile (the connector's output length)

    def text(self, rows: int, cols: int) -> str:
        tile = self.image * self.seq_len
        whole = f"{self.around}{self.global_image}{tile}{self.around}"
        if rows == 0 and cols == 0:
            return whole
        grid = "".join(
            "".join(f"{self.around}<row_{r + 1}_col_{c + 1}>{tile}" for c in range(cols)) + "\n" for r in range(rows)
        )
        return grid + "\n" + whole


class TiledImagePreparer:
    """Images for SmolVLM / Idefics3: resized, split into square tiles plus a global image
    (``SmolVLMImageProcessorPil`` / ``Idefics3ImageProcessorPil``); the item's span is :class:`TileMarkers`' text,
    tokenized by ``encode``."""

    kind = "image"

    def __init__(
        self,
        processor: Any,
        markers: TileMarkers,
        encode: Any,
        limits: ImageLimits = IMAGE_LIMITS,
        options: ImageOptions = IMAGE_OPTIONS,
    ):
        self.processor = processor  # the family's Pil image processor
        self.markers = markers  # how tiles are written
        self.encode = encode  # text -> token ids (the model's tokenizer, no special tokens added)
        self.limits = limits
        self.options = options
        settings = {**_settings(processor, _SPLIT_SETTINGS), "seq_len": markers.seq_len}
        self.fingerprint = image_mod.fingerprint(type(processor).__name__, options, settings)

    def prepare(self, data: bytes, declared: str | None, item: str) -> PreparedMedia:
        decoded = image_mod.decode(data, self.limits, self.options, declared=declared, item=item)
        out = self.processor(images=[[decoded.image]], return_row_col_info=True, return_tensors="pt")
        rows, cols = int(out["rows"][0][0]), int(out["cols"][0][0])
        layout = tuple(self.encode(self.markers.text(rows, cols)))
        inputs = {"pixel_values": out["pixel_values"].float(), "pixel_attention_mask": out["pixel_attention_mask"]}
        return PreparedMedia("image", tokens=len(layout), inputs=inputs, layout=layout)


# ================================================================ Pixtral (Mistral 3): rows of patches with breaks

_PIXTRAL_SETTINGS = (*_PIXEL_SETTINGS, "patch_size", "do_pad")


@dataclass(frozen=True, slots=True)
class RowMarkers:
    """How a Pixtral image is written in the prompt (Mistral 3): its rows of merged patches, each row's image tokens
    followed by ``[IMG_BREAK]``, the last row's by ``[IMG_END]`` instead. Token ids, no text."""

    image: int  # [IMG]
    row_break: int  # [IMG_BREAK]
    end: int  # [IMG_END]
    patch: int  # pixels per prompt token along each side (the tower's patch times the merge size)

    def layout(self, height: int, width: int) -> tuple[int, ...]:
        rows, cols = height // self.patch, width // self.patch
        tokens = ([self.image] * cols + [self.row_break]) * rows
        tokens[-1] = self.end
        return tuple(tokens)


class PixtralImagePreparer:
    """Images for a Pixtral tower (Mistral 3): resized to fit ``size`` in multiples of the merged patch
    (``PixtralImageProcessorPil``), any aspect ratio; the item's span is :class:`RowMarkers`' layout."""

    kind = "image"

    def __init__(
        self,
        processor: Any,
        markers: RowMarkers,
        limits: ImageLimits = IMAGE_LIMITS,
        options: ImageOptions = IMAGE_OPTIONS,
    ):
        self.processor = processor  # a PixtralImageProcessorPil, its patch_size the merged patch
        self.markers = markers  # how rows are written
        self.limits = limits
        self.options = options
        self.fingerprint = image_mod.fingerprint(
            type(processor).__name__, options, _settings(processor, _PIXTRAL_SETTINGS)
        )

    def prepare(self, data: bytes, declared: str | None, item: str) -> PreparedMedia:
        decoded = image_mod.decode(data, self.limits, self.options, declared=declared, item=item)
        try:
            out = self.processor(images=[decoded.image], return_tensors="pt")
        except ValueError as exc:  # a side resized to 0 pixels: an aspect ratio the processor cannot take
            size = "x".join(str(v) for v in decoded.image.size)
            message = f"the image ({size} pixels) is too narrow for this model: a side would be resized to nothing"
            raise UnsupportedFormatError(message, item=item) from exc
        height, width = (int(v) for v in out["image_sizes"][0])
        if height <= self.markers.patch and width <= self.markers.patch:  # the tower's merger fails on one patch
            patch = self.markers.patch
            message = f"the image is too small for this model: at most {patch}x{patch} pixels make a single patch"
            raise UnsupportedFormatError(message, item=item)
        layout = self.markers.layout(height, width)
        inputs = {"pixel_values": out["pixel_values"].float(), "image_sizes": out["image_sizes"]}
        return PreparedMedia("image", tokens=len(layout), inputs=inputs, layout=layout)
