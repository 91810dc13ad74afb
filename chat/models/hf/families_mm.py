"""Which multimodal families are served, and how each takes media (placeholders, preparers, encoders, positions).

Served: Qwen2-VL and Qwen2.5-VL (images, video; 3-D mRoPE), the Qwen2.5-Omni thinker (images, audio, and video with
its audio track interleaved, as ``use_audio_in_video``; 3-D mRoPE), LLaVA (images; 1-D RoPE), SmolVLM and Idefics3
(images split into tiles plus a global image, each written with its markers; 1-D RoPE), Mistral 3 (a Pixtral
tower: images of any aspect ratio as rows of patches with break markers; 1-D RoPE), Qwen3.5 with its vision
tower (images and videos as Qwen3-VL's without deepstack features, 3-D mRoPE, on a hybrid of gated delta-net and
attention layers: recurrent snapshots at every item's edges, see ``chat.engine.turn``), Gemma 3
(images; sliding window + full attention), Qwen3-VL and Qwen3-VL-MoE (images, and videos written frame group by
frame group with timestamps; 3-D mRoPE; deepstack features added to the first decoder layers' outputs at the media
positions). Every other multimodal family is refused with a reason.

Gemma 3's image tokens attend to each other both ways; it is served by computing each item whole: the
adapter marks the item's tokens as a block of the packed forward (:attr:`chat.models.hf.ragged.PackedRun.blocks`), and
the engine never cuts an item between prefill chunks (``ModelRuntime.whole_media_spans``).

A family (:class:`MultimodalFamily`) and its encoders (each tower's call, prepared inputs -> embedding rows) are
defined here, not beside the adapter that runs them (:mod:`chat.models.hf.multimodal`): a model's renderer (a
cluster's ingress, :mod:`chat.models.renderer_loading`) reads its family without importing transformers' forward.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from chat.models.errors import ModelLoadError, UnsupportedArchitectureError
from chat.models.hf.media_prep import (
    ClipImagePreparer,
    FrameMarkers,
    PixtralImagePreparer,
    PreparedMedia,
    Preparer,
    QwenImagePreparer,
    QwenVideoPreparer,
    RowMarkers,
    TiledImagePreparer,
    TileMarkers,
    TimestampedVideoPreparer,
    WhisperAudioPreparer,
)
from modalities.video import VideoOptions

AUDIO_IN_VIDEO_MARKERS = ("vision_start", "audio_start", "audio_end", "vision_end")  # MultimodalFamily.markers' keys,
# in span order (and the configs' `<name>_token_id` attributes)

Encoder = Callable[[Any, PreparedMedia], Any]  # (full HF model, prepared item) -> rows [tokens, hidden], or for
# families with deepstack features (rows, deepstack [layers, tokens, hidden])


@dataclass(frozen=True, slots=True)
class MultimodalFamily:
    """How one model family takes media."""

    name: str  # e.g. "qwen2_5_omni_thinker", "llava"
    placeholders: Mapping[str, int]  # kind -> the placeholder token its chat template emits (expanded per item)
    preparers: Mapping[str, Preparer]  # kind -> bytes to encoder inputs
    encoders: Mapping[str, Encoder]  # kind -> encoder inputs to embedding rows
    mrope: Any = None  # chat.models.hf.mrope.MropeSpec for 3-D positions, None for 1-D
    markers: Mapping[str, int] = field(default_factory=dict)  # Omni videos with audio: "vision_start", "audio_start",
    # "audio_end", "vision_end" -> token ids (the four markers framing an interleaved item); empty otherwise
    template_text: Mapping[str, str] = field(default_factory=dict)  # text the chat template writes -> what the
    # model's processor writes instead, before tokenizing (Gemma 3: the newlines and markers around an image)
    bidirectional: bool = False  # an item's tokens attend to each other both ways (Gemma 3): computed whole
    deepstack: int = 0  # decoder layers whose outputs take the items' deepstack features (Qwen3-VL); 0: none


# ==================================================================== encoders


def _rows(out: Any) -> torch.Tensor:
    pooled = getattr(out, "pooler_output", None)
    value = pooled if pooled is not None else getattr(out, "last_hidden_state", out)
    if isinstance(value, list | tuple):
        value = torch.cat([v.reshape(-1, v.shape[-1]) for v in value])
    return value.reshape(-1, value.shape[-1])


def qwen_image_rows(model: Any, p: PreparedMedia) -> torch.Tensor:
    return _rows(model.model.get_image_features(p.inputs["pixel_values"], p.inputs["image_grid_thw"]))


def qwen_video_rows(model: Any, p: PreparedMedia) -> torch.Tensor:
    return _rows(model.model.get_video_features(p.inputs["pixel_values_videos"], p.inputs["video_grid_thw"]))


def omni_audio_rows(model: Any, p: PreparedMedia) -> torch.Tensor:
    features = p.inputs["input_features"]  # [mels, frames]
    mask = torch.ones((1, features.shape[1]), dtype=torch.long)
    out = model.model.get_audio_features(features.unsqueeze(0), feature_attention_mask=mask)
    return out.last_hidden_state.reshape(-1, out.last_hidden_state.shape[-1])


def llava_image_rows(model: Any, p: PreparedMedia) -> torch.Tensor:
    config = model.config
    out = model.model.get_image_features(
        pixel_values=p.inputs["pixel_values"],
        vision_feature_layer=config.vision_feature_layer,
        vision_feature_select_strategy=config.vision_feature_select_strategy,
    )
    return _rows(out)


def tiled_image_rows(model: Any, p: PreparedMedia) -> torch.Tensor:
    """SmolVLM / Idefics3: every tile and the global image through the tower and the pixel-shuffle connector."""
    out = model.model.get_image_features(
        pixel_values=p.inputs["pixel_values"], pixel_attention_mask=p.inputs["pixel_attention_mask"]
    )
    return _rows(out)


def pixtral_image_rows(model: Any, p: PreparedMedia) -> torch.Tensor:
    """Mistral 3: the Pixtral tower's chosen layer, through the patch-merging projector."""
    out = model.model.get_image_features(
        pixel_values=p.inputs["pixel_values"],
        image_sizes=p.inputs["image_sizes"],
        vision_feature_layer=model.config.vision_feature_layer,
    )
    return _rows(out)


def gemma3_image_rows(model: Any, p: PreparedMedia) -> torch.Tensor:
    """Gemma 3: the SigLIP tower, pooled and projected to ``mm_tokens_per_image`` rows."""
    return _rows(model.model.get_image_features(pixel_values=p.inputs["pixel_values"]))


def _deepstack_rows(out: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """``(rows [tokens, hidden], deepstack [layers, tokens, hidden])`` of a Qwen3-VL vision output."""
    layers = [torch.cat(list(per_layer)) for per_layer in out.deepstack_features]
    return _rows(out), torch.stack(layers)


def qwen3_image_rows(model: Any, p: PreparedMedia) -> tuple[torch.Tensor, torch.Tensor]:
    """Qwen3-VL: the merger's rows and the deepstack mergers' rows of one image."""
    return _deepstack_rows(model.model.get_image_features(p.inputs["pixel_values"], p.inputs["image_grid_thw"]))


def qwen3_video_rows(model: Any, p: PreparedMedia) -> tuple[torch.Tensor, torch.Tensor]:
    """Qwen3-VL: the merger's rows and the deepstack mergers' rows of one video's frame groups, in order."""
    out = model.model.get_video_features(p.inputs["pixel_values_videos"], p.inputs["video_grid_thw"])
    return _deepstack_rows(out)


# ==================================================================== families

QWEN_TYPES = ("qwen2_vl", "qwen2_5_vl", "qwen2_5_omni_thinker", "qwen2_5_omni")
SERVED = {
    "qwen2_vl": "images and video, 3-D mRoPE",
    "qwen2_5_vl": "images and video, 3-D mRoPE",
    "qwen2_5_omni_thinker": "images, audio and video, 3-D mRoPE (tiny-omni)",
    "qwen2_5_omni": "its thinker: images, audio and video, 3-D mRoPE",
    "llava": "images, 1-D RoPE (tiny-llava)",
    "smolvlm": "images as tiles plus a global image, 1-D RoPE (tiny-smolvlm)",
    "idefics3": "images as tiles plus a global image, 1-D RoPE",
    "qwen3_5": "images and videos (frame groups with timestamps), 3-D mRoPE, hybrid recurrent (gated delta-net + "
    "attention) (tiny-qwen35vl)",
    "mistral3": "images (a Pixtral tower: any aspect ratio, rows of patches with breaks), 1-D RoPE (tiny-mistral3)",
    "gemma3": "images, each computed whole (its tokens attend to each other both ways), sliding window + full "
    "attention (tiny-gemma3mm)",
    "qwen3_vl": "images and videos (frame groups with timestamps), 3-D mRoPE, deepstack features (tiny-qwen3vl)",
    "qwen3_vl_moe": "images and videos (frame groups with timestamps), 3-D mRoPE, deepstack features, MoE "
    "(tiny-qwen3vlmoe)",
}
REFUSED: dict[str, str] = {}  # model type -> why it is refused (none at present; unknown families are refused too)
DEFAULT_VIDEO_FRAMES = 16
QWEN_ENCODERS = {"image": qwen_image_rows, "video": qwen_video_rows}  # towers without deepstack mergers


def is_multimodal(config: Any) -> bool:
    return any(hasattr(config, k) for k in ("vision_config", "audio_config", "thinker_config"))


def check_multimodal_config(config: Any) -> None:
    """Raises UnsupportedArchitectureError unless :data:`SERVED` lists the config's model type."""
    model_type = str(getattr(config, "model_type", "unknown"))
    if model_type in REFUSED:
        raise UnsupportedArchitectureError(model_type, REFUSED[model_type], sorted(SERVED))
    if model_type not in SERVED:
        raise UnsupportedArchitectureError(
            model_type, "this multimodal family is not served (its media handling is not implemented)", sorted(SERVED)
        )


def _token(config: Any, *names: str) -> int | None:
    for name in names:
        for holder in (config, getattr(config, "text_config", None)):
            value = getattr(holder, name, None) if holder is not None else None
            if isinstance(value, int):
                return value
    return None


def qwen_family(
    config: Any,
    *,
    image_processor: Any,
    video_processor: Any | None = None,
    video_frames: int = DEFAULT_VIDEO_FRAMES,
    audio_extractor: Any | None = None,
) -> MultimodalFamily:
    """Qwen2-VL / Qwen2.5-VL / Qwen2.5-Omni thinker. With both video and audio (Omni), a video's audio track is
    interleaved with its frames (``use_audio_in_video``): the video preparer takes the audio preparer, and the
    family names the four marker tokens around such an item."""
    from chat.models.hf.mrope import MropeSpec

    mrope = MropeSpec.from_config(config)
    placeholders = {"image": _token(config, "image_token_id", "image_token_index")}
    preparers: dict[str, Any] = {"image": QwenImagePreparer(image_processor)}
    encoders: dict[str, Any] = {"image": qwen_image_rows}
    audio = WhisperAudioPreparer(audio_extractor) if audio_extractor is not None else None
    markers: dict[str, int | None] = {}
    if audio is not None:
        placeholders["audio"] = _token(config, "audio_token_id", "audio_token_index")
        preparers["audio"] = audio
        encoders["audio"] = omni_audio_rows
    if video_processor is not None:
        placeholders["video"] = _token(config, "video_token_id", "video_token_index")
        in_video = audio if audio is not None and mrope.family == "qwen2_5_omni" else None
        options = VideoOptions(num_frames=video_frames)
        preparers["video"] = QwenVideoPreparer(video_processor, options=options, audio=in_video, mrope=mrope)
        encoders["video"] = qwen_video_rows
        if in_video is not None:
            markers = {name: _token(config, f"{name}_token_id") for name in AUDIO_IN_VIDEO_MARKERS}
    missing = [kind for kind, token in {**placeholders, **markers}.items() if token is None]
    if missing:
        raise ModelLoadError(f"the config names no token for {', '.join(missing)}")
    return MultimodalFamily(
        name=str(config.model_type),
        placeholders=placeholders,
        preparers=preparers,
        encoders=encoders,
        mrope=mrope,
        markers=markers,  # type: ignore[arg-type]  # checked above: no None left
    )


def qwen3_family(
    config: Any,
    tokenizer: Any,
    *,
    image_processor: Any,
    video_processor: Any,
    video_frames: int = DEFAULT_VIDEO_FRAMES,
) -> MultimodalFamily:
    """Qwen3-VL / Qwen3-VL-MoE / Qwen3.5: images as Qwen2-VL's (a run of placeholders); videos written as
    ``Qwen3VLProcessor`` writes them, per temporal patch ``<t seconds><|vision_start|>`` placeholders
    ``<|vision_end|>`` inside the template's own ``<|vision_start|>`` / ``<|vision_end|>`` (:class:`FrameMarkers`);
    with a tower that has deepstack mergers (Qwen3-VL), each item's deepstack rows go to the first
    ``len(deepstack_visual_indexes)`` decoder layers.

    Raises:
        ModelLoadError: the config names no image, video or vision marker token.
    """
    from chat.models.hf.mrope import MropeSpec

    ids = {name: _token(config, f"{name}_token_id") for name in ("image", "video", "vision_start", "vision_end")}
    missing = [name for name, token in ids.items() if token is None]
    if missing:
        raise ModelLoadError(f"the config names no token for {', '.join(missing)}")

    def encode(text: str) -> list[int]:
        return tokenizer.encode(text, add_special_tokens=False)

    markers = FrameMarkers(ids["video"], ids["vision_start"], ids["vision_end"], encode)  # type: ignore[arg-type]
    deepstack = len(getattr(config.vision_config, "deepstack_visual_indexes", None) or ())
    encoders = {"image": qwen3_image_rows, "video": qwen3_video_rows} if deepstack else QWEN_ENCODERS
    return MultimodalFamily(
        name=str(config.model_type),
        placeholders={"image": ids["image"], "video": ids["video"]},  # type: ignore[dict-item]
        preparers={
            "image": QwenImagePreparer(image_processor),
            "video": TimestampedVideoPreparer(video_processor, markers, options=VideoOptions(num_frames=video_frames)),
        },
        encoders=encoders,
        mrope=MropeSpec.from_config(config),
        deepstack=deepstack,
    )


def llava_family(config: Any, processor: Any) -> MultimodalFamily:
    vision = config.vision_config
    tokens = (vision.image_size // vision.patch_size) ** 2
    if config.vision_feature_select_strategy == "full":
        tokens += 1
    token = _token(config, "image_token_id", "image_token_index")
    if token is None:
        raise ModelLoadError("the config names no image placeholder token")
    return MultimodalFamily(
        name="llava",
        placeholders={"image": token},
        preparers={"image": ClipImagePreparer(processor, tokens)},
        encoders={"image": llava_image_rows},
    )


def tiled_family(config: Any, processor: Any, tokenizer: Any) -> MultimodalFamily:
    """SmolVLM / Idefics3: an image is its tiles and global image, each ``seq_len`` image tokens after the tower's
    pixel-shuffle connector, written with :class:`TileMarkers` (the layout transformers' processor writes).

    Raises:
        ModelLoadError: the tokenizer lacks the image token or the tile markers as single tokens.
    """
    vision = config.vision_config
    seq_len = (vision.image_size // vision.patch_size) ** 2 // (config.scale_factor**2)
    markers = TileMarkers("<image>", "<fake_token_around_image>", "<global-img>", seq_len)
    names = (markers.image, markers.around, markers.global_image)
    ids = {name: tokenizer.convert_tokens_to_ids(name) for name in names}
    unknown = getattr(tokenizer, "unk_token_id", None)
    missing = [name for name, token in ids.items() if not isinstance(token, int) or token == unknown]
    if missing or ids[markers.image] != config.image_token_id:
        raise ModelLoadError(f"the tokenizer lacks the image markers {missing or [markers.image]} as single tokens")

    def encode(text: str) -> list[int]:
        return tokenizer.encode(text, add_special_tokens=False)

    return MultimodalFamily(
        name=str(config.model_type),
        placeholders={"image": config.image_token_id},
        preparers={"image": TiledImagePreparer(processor, markers, encode)},
        encoders={"image": tiled_image_rows},
    )


def pixtral_family(config: Any, processor: Any, tokenizer: Any) -> MultimodalFamily:
    """Mistral 3 with its Pixtral tower: each image its rows of merged patches, ``[IMG_BREAK]`` after each row and
    ``[IMG_END]`` after the last (the layout transformers' ``PixtralProcessor`` writes).

    Raises:
        ModelLoadError: the tokenizer lacks the break or end marker.
    """
    names = ("[IMG_BREAK]", "[IMG_END]")
    ids = [tokenizer.convert_tokens_to_ids(name) for name in names]
    unknown = getattr(tokenizer, "unk_token_id", None)
    if any(not isinstance(token, int) or token == unknown for token in ids):
        raise ModelLoadError(f"the tokenizer lacks the image markers {list(names)} as single tokens")
    patch = config.vision_config.patch_size * config.spatial_merge_size
    markers = RowMarkers(config.image_token_index, ids[0], ids[1], patch)
    return MultimodalFamily(
        name="mistral3",
        placeholders={"image": config.image_token_index},
        preparers={"image": PixtralImagePreparer(processor, markers)},
        encoders={"image": pixtral_image_rows},
    )


def gemma3_family(config: Any, processor: Any, tokenizer: Any) -> MultimodalFamily:
    """Gemma 3: the template writes ``<start_of_image>``; the processor writes a blank line, that marker,
    ``mm_tokens_per_image`` image tokens, ``<end_of_image>`` and a blank line. The image tokens attend to each other
    both ways (``bidirectional``): a prefill chunk never cuts them, and a cached prefix never ends inside them (as
    for every item).

    Raises:
        ModelLoadError: the tokenizer lacks the image markers.
    """
    ids = {"boi": config.boi_token_index, "eoi": config.eoi_token_index, "image": config.image_token_index}
    names = {key: tokenizer.convert_ids_to_tokens(token) for key, token in ids.items()}
    if any(not isinstance(name, str) or not name for name in names.values()):
        raise ModelLoadError(f"the tokenizer lacks the image markers {ids}")
    return MultimodalFamily(
        name="gemma3",
        placeholders={"image": ids["image"]},
        preparers={"image": ClipImagePreparer(processor, config.mm_tokens_per_image)},
        encoders={"image": gemma3_image_rows},
        template_text={names["boi"]: f"\n\n{names['boi']}{names['image']}{names['eoi']}\n\n"},
        bidirectional=True,
    )


# ==================================================================== local directories


MODEL_CLASSES = {  # served model type -> the transformers class that loads it
    "qwen2_vl": "Qwen2VLForConditionalGeneration",
    "qwen2_5_vl": "Qwen2_5_VLForConditionalGeneration",
    "qwen2_5_omni_thinker": "Qwen2_5OmniThinkerForConditionalGeneration",
    "qwen2_5_omni": "Qwen2_5OmniThinkerForConditionalGeneration",
    "llava": "LlavaForConditionalGeneration",
    "smolvlm": "SmolVLMForConditionalGeneration",
    "idefics3": "Idefics3ForConditionalGeneration",
    "qwen3_5": "Qwen3_5ForConditionalGeneration",
    "mistral3": "Mistral3ForConditionalGeneration",
    "gemma3": "Gemma3ForConditionalGeneration",
    "qwen3_vl": "Qwen3VLForConditionalGeneration",
    "qwen3_vl_moe": "Qwen3VLMoeForConditionalGeneration",
}
TILED_PROCESSORS = {  # tiled families: their Pil image processor (module, class)
    "smolvlm": ("transformers.models.smolvlm.image_processing_pil_smolvlm", "SmolVLMImageProcessorPil"),
    "idefics3": ("transformers.models.idefics3.image_processing_pil_idefics3", "Idefics3ImageProcessorPil"),
}


def load_multimodal(
    path: Path, config: Any, torch_dtype: Any, chat_template: str | None = None
) -> tuple[Any, Any, MultimodalFamily]:
    """``(model, tokenizer, family)`` of a local multimodal model directory, with its own processor settings;
    ``chat_template`` (compiled) replaces the directory's own.

    Raises:
        UnsupportedArchitectureError: a family that is not served.
        ModelLoadError: files missing or unreadable, no chat template (a media model's placeholders come from it).
    """
    check_multimodal_config(config)
    try:
        tokenizer = _tokenizer(path, chat_template)
        model = _model_class(config).from_pretrained(str(path), dtype=torch_dtype, local_files_only=True)
        family = directory_family(path, model.config, tokenizer)
    except (OSError, ValueError, KeyError) as exc:
        raise ModelLoadError(f"cannot load the multimodal model in {path}: {exc}") from exc
    return model.eval(), tokenizer, family


def load_multimodal_text(path: Path, config: Any, chat_template: str | None = None) -> tuple[Any, MultimodalFamily]:
    """``(tokenizer, family)`` of a local multimodal model directory, as :func:`load_multimodal` gives them, without
    reading its weights: the config is the one the model class reads, the family holds the processors.

    Raises:
        UnsupportedArchitectureError: a family that is not served.
        ModelLoadError: files missing or unreadable, no chat template.
    """
    check_multimodal_config(config)
    try:
        tokenizer = _tokenizer(path, chat_template)
        model_config = _model_class(config).config_class.from_pretrained(str(path), local_files_only=True)
        family = directory_family(path, model_config, tokenizer)
    except (OSError, ValueError, KeyError) as exc:
        raise ModelLoadError(f"cannot load the multimodal model in {path}: {exc}") from exc
    return tokenizer, family


def directory_family(path: Path, config: Any, tokenizer: Any) -> MultimodalFamily:
    """How the model in ``path`` takes media, from ``config`` (its model class's), its processor files and its
    tokenizer."""
    if config.model_type in TILED_PROCESSORS:
        import importlib

        module, name = TILED_PROCESSORS[config.model_type]
        processor_class = getattr(importlib.import_module(module), name)
        return tiled_family(config, processor_class.from_pretrained(str(path), local_files_only=True), tokenizer)
    if config.model_type == "gemma3":
        from transformers.models.gemma3.image_processing_pil_gemma3 import Gemma3ImageProcessorPil

        processor = Gemma3ImageProcessorPil.from_pretrained(str(path), local_files_only=True)
        processor.do_pan_and_scan = False  # crops would be further images the template never wrote
        return gemma3_family(config, processor, tokenizer)
    if config.model_type == "mistral3":
        from transformers.models.pixtral.image_processing_pil_pixtral import PixtralImageProcessorPil

        processor = PixtralImageProcessorPil.from_pretrained(str(path), local_files_only=True)
        merged = config.vision_config.patch_size * config.spatial_merge_size
        processor.patch_size = {"height": merged, "width": merged}  # what PixtralProcessor hands it
        return pixtral_family(config, processor, tokenizer)
    if config.model_type == "llava":
        from transformers.models.llava.image_processing_pil_llava import LlavaImageProcessorPil

        return llava_family(config, LlavaImageProcessorPil.from_pretrained(str(path), local_files_only=True))
    if config.model_type in QWEN3_TYPES:
        return _qwen3_family_from_files(path, config, tokenizer)
    return _qwen_family_from_files(path, config)


QWEN3_TYPES = ("qwen3_vl", "qwen3_vl_moe", "qwen3_5")  # videos as frame groups with timestamps (Qwen3VLProcessor)
_QWEN3_VIDEO_SETTINGS = (  # what a Qwen3-VL video_preprocessor_config.json holds that the video preparer uses
    "size",
    "patch_size",
    "temporal_patch_size",
    "merge_size",
    "image_mean",
    "image_std",
    "resample",
    "do_rescale",
    "rescale_factor",
    "do_normalize",
)


def _qwen3_family_from_files(path: Path, config: Any, tokenizer: Any) -> MultimodalFamily:
    """Qwen3-VL: images with ``preprocessor_config.json``'s settings, videos with ``video_preprocessor_config.json``'s
    (its ``size`` is the pixel budget of a whole clip; ``max_frames`` caps the frames taken)."""
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    image = Qwen2VLImageProcessorPil.from_pretrained(str(path), local_files_only=True)
    video_file = path / "video_preprocessor_config.json"
    settings = json.loads(video_file.read_text()) if video_file.is_file() else {}
    video = Qwen2VLImageProcessorPil(**{k: settings[k] for k in _QWEN3_VIDEO_SETTINGS if k in settings})
    frames = settings.get("max_frames") if isinstance(settings.get("max_frames"), int) else None
    return qwen3_family(
        config,
        tokenizer,
        image_processor=image,
        video_processor=video,
        video_frames=min(frames or DEFAULT_VIDEO_FRAMES, DEFAULT_VIDEO_FRAMES),
    )


def _tokenizer(path: Path, chat_template: str | None = None) -> Any:
    """The directory's tokenizer with its chat template (``chat_template`` when given, else from the tokenizer's
    files, else a template file).

    Raises: ModelLoadError when there is no chat template; OSError, ValueError or KeyError when files are unreadable.
    """
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    if chat_template is not None:
        tokenizer.chat_template = chat_template
    if not getattr(tokenizer, "chat_template", None):
        tokenizer.chat_template = _template_file(path)
    if not getattr(tokenizer, "chat_template", None):
        raise ModelLoadError(f"{path} has no chat template; a chat model needs one")
    return tokenizer


def _model_class(config: Any) -> Any:
    import transformers

    return getattr(transformers, MODEL_CLASSES[config.model_type])


def _qwen_family_from_files(path: Path, config: Any) -> MultimodalFamily:
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    image = Qwen2VLImageProcessorPil.from_pretrained(str(path), local_files_only=True)
    video_file = path / "video_preprocessor_config.json"
    video_settings = json.loads(video_file.read_text()) if video_file.is_file() else {}
    video = Qwen2VLImageProcessorPil.from_pretrained(str(path), local_files_only=True)
    for key in ("min_pixels", "max_pixels"):
        if isinstance(video_settings.get(key), int):
            video.size = {
                **dict(video.size),
                {"min_pixels": "shortest_edge", "max_pixels": "longest_edge"}[key]: video_settings[key],
            }
    audio = None
    if hasattr(config, "audio_config") and (path / "preprocessor_config.json").is_file():
        from transformers import WhisperFeatureExtractor

        audio = WhisperFeatureExtractor.from_pretrained(str(path), local_files_only=True)
    frames = video_settings.get("max_frames") if isinstance(video_settings.get("max_frames"), int) else None
    return qwen_family(
        config,
        image_processor=image,
        video_processor=video,
        video_frames=min(frames or DEFAULT_VIDEO_FRAMES, DEFAULT_VIDEO_FRAMES),
        audio_extractor=audio,
    )


def _template_file(path: Path) -> str | None:
    jinja = path / "chat_template.jinja"
    if jinja.is_file():
        return jinja.read_text()
    js = path / "chat_template.json"
    if js.is_file():
        value = json.loads(js.read_text()).get("chat_template")
        return value if isinstance(value, str) else None
    return None
